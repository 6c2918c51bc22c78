"""`coordl demo`: the main job end to end on a small dataset it makes itself.

It measures the way bench/loaders.py does, so that the two agree: both loaders
are built once (persistent workers, same batch size and worker count), each
runs one warm-up epoch (worker start, page cache, first touch), then
``rounds`` interleaved rounds (coordl, torch, coordl, torch, ...) with
``settle`` seconds idle after every epoch; a loader's rate is the images of
one whole epoch over its wall time, and the ratio is the median of the
per-round ratios (min-max). bench/loaders.py also charges a loader the CPU it
used between its epochs; both loaders here idle between epochs, so that
charge is ~0 and is left out. The demo prints what it measured and the
bench/loaders.py command that measures the same thing.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import click
import torch


def epoch_rate(loader) -> tuple[float, int, Any]:
    """(images/s, images, last batch) of one whole epoch of `loader`."""
    n, last, t0 = 0, None, time.perf_counter()
    for batch in loader:
        n += batch[0].shape[0]
        last = batch
    return n / (time.perf_counter() - t0), n, last


def interleaved(loaders: dict, rounds: int, settle: float) -> dict[str, list[float]]:
    """bench/loaders.py's rule: one warm-up epoch each, then `rounds` rounds of one epoch per
    loader in turn, `settle` s idle after each epoch; images/s of every timed epoch."""
    for loader in loaders.values():
        epoch_rate(loader)
        time.sleep(settle)
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(rounds):
        for name, loader in loaders.items():
            rates[name].append(epoch_rate(loader)[0])
            time.sleep(settle)
    return rates


def run_demo(root: str, images: int, batch_size: int, workers: int, epochs: int, make: bool,
             settle: float = 1.0) -> dict:
    """`epochs`: timed epochs per loader (interleaved rounds), after one warm-up epoch each."""
    import PIL

    import coordl
    from coordl.cli.baseline import TorchvisionStyleFolder, worker_init_fn
    from coordl.cli.make_dataset import make_dataset

    if make:
        click.echo(f"[1/3] making {images} JPEGs (500x375, quality 90) in {root}")
        make_dataset(root, images, classes=10)
    ds = coordl.ImageFolder(root, transform="train")
    click.echo(f"      {len(ds)} images, {len(ds.classes)} classes, "
               f"{ds.manifest.total_bytes / len(ds) / 1024:.0f} KiB mean, fingerprint {ds.fingerprint[:12]}")
    pil = "pillow-simd" if ".post" in PIL.__version__ else "Pillow"
    common: dict[str, Any] = dict(batch_size=batch_size, shuffle=True, num_workers=workers,
                                  persistent_workers=workers > 0)
    theirs_label = "torch+" + pil
    click.echo(f"[2/3] coordl.DataLoader and torch.utils.data.DataLoader + {pil} (torchvision-style "
               f"Dataset), {workers} workers each, batch {batch_size}, train transform to 224x224")
    click.echo(f"      measured as bench/loaders.py: 1 warm-up epoch each, then {epochs} interleaved "
               f"rounds (one epoch of each loader in turn, {settle:g} s idle after each epoch)")
    loaders = {"coordl": coordl.DataLoader(ds, **common),
               theirs_label: torch.utils.data.DataLoader(TorchvisionStyleFolder(root),
                                                         worker_init_fn=worker_init_fn, **common)}
    try:
        rates = interleaved(loaders, epochs, settle)
        _, _, (x, y) = epoch_rate(loaders["coordl"])  # one more, untimed: a batch and the stats
        stats = loaders["coordl"].stats()
    finally:
        del loaders
    click.echo(f"[3/3] coordl batch {tuple(x.shape)} {x.dtype}, labels {tuple(y.shape)} {y.dtype}; "
               f"stats: {stats}")
    del x, y
    ratios = [a / b for a, b in zip(rates["coordl"], rates[theirs_label])]
    a, b, r = statistics.median(rates["coordl"]), statistics.median(rates[theirs_label]), statistics.median(ratios)
    width = max(len(theirs_label), len("coordl")) + 2
    click.echo(f"\n  {'coordl':<{width}}{a:8.0f} images/s  (median of {epochs} epochs)")
    click.echo(f"  {theirs_label:<{width}}{b:8.0f} images/s  (median of {epochs} epochs)")
    click.echo(f"  {'ratio':<{width}}{r:8.2f}x  (median of {epochs} per-round ratios, "
               f"{min(ratios):.2f}-{max(ratios):.2f}; {len(ds)} images per epoch, "
               f"{len(os.sched_getaffinity(0))} cores)")
    bench_pil = "torch-simd" if pil == "pillow-simd" else "torch-pillow"
    click.echo(f"  the same measurement by bench/loaders.py (which can add plain Pillow and DALI):\n"
               f"    .venv/bin/python bench/loaders.py {'DIR' if make else root} --loaders "
               f"coordl,{bench_pil} --repeats {epochs} --batch-size {batch_size} --workers {workers}"
               + (f"\n  (DIR: `coordl make-dataset DIR --images {images} --classes 10`, then "
                  f"`coordl demo --data DIR` measures that folder)" if make else ""))
    return {"coordl": a, "torch": b, "ratio": r, "rates": rates, "ratios": ratios}
