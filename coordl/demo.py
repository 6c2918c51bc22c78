"""`coordl demo`: the main job end to end on a small dataset it makes itself."""

from __future__ import annotations

import os
import statistics
import time

import click
import torch


def time_epochs(loader, epochs: int) -> list[float]:
    """Images/s of each epoch of `loader` (every batch fully received)."""
    rates = []
    for _ in range(epochs):
        n, t0 = 0, time.perf_counter()
        for images, _labels in loader:
            n += images.shape[0]
        rates.append(n / (time.perf_counter() - t0))
    return rates


def run_demo(root: str, images: int, batch_size: int, workers: int, epochs: int, make: bool) -> dict:
    import coordl
    from coordl.baseline import TorchvisionStyleFolder, worker_init_fn
    from coordl.synthetic import make_dataset

    if make:
        click.echo(f"[1/3] making {images} JPEGs (500x375, quality 90) in {root}")
        make_dataset(root, images, classes=10)
    ds = coordl.ImageFolder(root, transform="train")
    click.echo(f"      {len(ds)} images, {len(ds.classes)} classes, "
               f"{ds.manifest.total_bytes / len(ds) / 1024:.0f} KiB mean, fingerprint {ds.fingerprint[:12]}")
    common = dict(batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    click.echo(f"[2/3] coordl.DataLoader, {workers} workers, {epochs} epochs + 1 warm-up")
    loader = coordl.DataLoader(ds, **common)
    time_epochs(loader, 1)
    ours = time_epochs(loader, epochs)
    x, y = next(iter(loader))
    stats = loader.stats()
    del loader
    click.echo(f"      batch {tuple(x.shape)} {x.dtype}, labels {tuple(y.shape)} {y.dtype}; "
               f"stats: {stats}")
    import PIL

    pil = "pillow-simd" if ".post" in PIL.__version__ else "Pillow"
    click.echo(f"[3/3] torch.utils.data.DataLoader + {pil} (torchvision-style Dataset), same settings")
    base = torch.utils.data.DataLoader(TorchvisionStyleFolder(root), worker_init_fn=worker_init_fn, **common)
    time_epochs(base, 1)
    theirs = time_epochs(base, epochs)
    del base
    a, b = statistics.median(ours), statistics.median(theirs)
    theirs_label = "torch+" + pil
    width = max(len(theirs_label), len("coordl")) + 2
    click.echo(f"\n  {'coordl':<{width}}{a:8.0f} images/s")
    click.echo(f"  {theirs_label:<{width}}{b:8.0f} images/s   (bench/loaders.py also runs plain Pillow and DALI)")
    click.echo(f"  {'ratio':<{width}}{a / b:8.2f}x  (median of {epochs} epochs each, {os.cpu_count()} cores)")
    return {"coordl": a, "torch": b}
