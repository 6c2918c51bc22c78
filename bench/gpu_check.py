"""GPU check of the DALI backend: nvJPEG ("mixed") decode against the CPU backend and plain DALI.

    .venv/bin/python bench/gpu_check.py [ROOT] [--workers W] [--epochs 2] [--out OUT]

ROOT (default /tmp/coordl-gpu-check) is an ImageFolder; when it does not
exist, 2,000 bench-like JPEGs (500x375, 20% at 1500x1125) are made there
first. On a machine where DALI sees no CUDA device it exits with status 2
and says so. One command, well under five minutes on a GPU server:

1. checks: `train` batches of coordl.DataLoader(backend="dali") with the GPU
   recipe (``loader.dali_device = "gpu"``) against the same loader on the
   CPU backend: same number of batches, shapes (B, 3, 224, 224) uint8, the
   very same labels in the same order, and pixels within PSNR >= 30 dB
   (same boxes and flips; nvJPEG's IDCT and the GPU resize round
   differently from libjpeg-turbo and Pillow). `val` too.
2. images/s, one warm-up epoch then --epochs timed ones, for
   coordl+DALI (mixed), the CPU backend (W worker processes) and plain DALI
   (fn.readers.file -> decoders.image_random_crop(device="mixed") -> resize
   -> crop_mirror_normalize, on the GPU). When torch has no CUDA (a CPU
   wheel) both DALI loaders copy their batches to host memory, so the
   comparison stays like for like.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

DEFAULT_ROOT = "/tmp/coordl-gpu-check"
PSNR_MIN = 30.0
DEADLINE_S = 240.0  # stop timing more epochs past this (the whole check stays under five minutes)


def _no_gpu() -> str | None:
    """Why this machine cannot run the check, or None."""
    from coordl import ConfigError
    from coordl.loader import dali as dali_loader

    try:
        dali_loader.require_dali()
        count = dali_loader.gpu_count()
    except (ConfigError, ImportError, RuntimeError, OSError) as e:
        return f"no GPU: DALI cannot query CUDA devices ({type(e).__name__}: {e})"
    return None if count > 0 else "no GPU: DALI sees no CUDA device (GetCUDADeviceCount() == 0)"


def _dataset(root: str) -> None:
    if os.path.isdir(root):
        return
    from coordl.cli.make_dataset import make_dataset

    print(f"[data] making 2000 JPEGs in {root}", flush=True)
    make_dataset(root, images=2000, classes=50, seed=0, large_fraction=0.2, progress=False)


def _loader(root: str, transform: str, batch: int, workers: int, backend: str, device: str = "gpu"):
    import coordl

    loader = coordl.DataLoader(coordl.ImageFolder(root, transform), batch_size=batch, shuffle=True,
                               num_workers=workers, backend=backend,
                               persistent_workers=backend == "cpu" and workers > 0)
    if backend == "dali":
        loader.dali_device = device  # (same as DataLoader(..., dali_device=device))
    return loader


def _psnr(a, b) -> float:
    mse = float(np.mean((a.cpu().numpy().astype(np.float64) - b.cpu().numpy().astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def check(root: str, batch: int, workers: int, device: str = "gpu") -> dict:
    """Shapes, labels and pixels of the GPU recipe against the CPU backend; raises SystemExit on a mismatch."""
    out = {}
    for transform in ("train", "val"):
        gpu = [(i.cpu().clone(), t.clone()) for i, t in _loader(root, transform, batch, workers, "dali", device)]
        cpu = [(i.clone(), t.clone()) for i, t in _loader(root, transform, batch, workers, "cpu")]
        problems = []
        if len(gpu) != len(cpu):
            problems.append(f"{len(gpu)} batches from DALI, {len(cpu)} from the CPU backend")
        worst = math.inf
        for k, ((gi, gl), (ci, cl)) in enumerate(zip(gpu, cpu)):
            if gi.shape != ci.shape or gi.dtype != ci.dtype or gi.shape[1:] != (3, 224, 224):
                problems.append(f"batch {k}: DALI {tuple(gi.shape)} {gi.dtype}, CPU {tuple(ci.shape)} {ci.dtype}")
            elif not np.array_equal(gl.numpy(), cl.numpy()):
                problems.append(f"batch {k}: labels differ")
            else:
                worst = min(worst, min(_psnr(a, b) for a, b in zip(gi, ci)))
        if worst < PSNR_MIN:
            problems.append(f"pixels: min PSNR {worst:.1f} dB < {PSNR_MIN} dB")
        print(f"[check] {transform}: {len(gpu)} batches, min PSNR vs CPU backend {worst:.1f} dB, "
              f"{'OK' if not problems else 'FAILED'}", flush=True)
        if problems:
            sys.exit("gpu_check FAILED (" + transform + "): " + "; ".join(problems[:5]))
        out[transform] = {"batches": len(gpu), "min_psnr_db": worst}
    return out


def _plain_dali(root: str, batch: int, threads: int, device: str = "gpu"):
    """Plain DALI with GPU decode and augmentation, read by DALI's own file reader."""
    import torch
    from nvidia.dali import fn, pipeline_def, types

    gpu = device == "gpu"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224, interp_type=types.INTERP_LINEAR, antialias=True)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    p = pipe()
    p.build()
    per_epoch = math.ceil(p.epoch_size("Reader") / batch)
    host = gpu and not torch.cuda.is_available()

    def epoch() -> int:
        n = 0
        for _ in range(per_epoch):
            images, _labels = p.run()
            n += len(images.as_cpu() if host else images)
        return n
    return epoch


def _timed(name: str, epoch, epochs: int, started: float) -> dict:
    epoch()  # warm-up: threads, nvJPEG handles, page cache
    rates = []
    for _ in range(epochs):
        if time.monotonic() - started > DEADLINE_S:
            break
        t0 = time.perf_counter()
        n = epoch()
        rates.append(n / (time.perf_counter() - t0))
    best = max(rates) if rates else float("nan")
    print(f"[speed] {name:24s} {best:8.0f} images/s (best of {len(rates)})", flush=True)
    return {"images_per_s": rates, "best": best}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", default=DEFAULT_ROOT)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="CPU backend worker processes and DALI threads")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--out", default=None, help="write OUT.json")
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu",
                   help="cpu: a dry run of this script with the CPU recipes (no GPU needed)")
    a = p.parse_args()
    why = _no_gpu() if a.device == "gpu" else None
    if why:
        print(f"{why}: bench/gpu_check.py needs an NVIDIA GPU; nothing was measured", file=sys.stderr)
        sys.exit(2)
    started = time.monotonic()
    _dataset(a.root)
    result = {"root": a.root, "batch_size": a.batch_size, "workers": a.workers,
              "device": a.device,
              "check": check(a.root, a.batch_size, a.workers, a.device), "speed": {}}

    def through(loader):
        return lambda: sum(images.shape[0] for images, _ in loader)

    mode = "mixed" if a.device == "gpu" else "cpu"
    runs = {
        f"coordl+dali ({mode})": lambda: through(_loader(a.root, "train", a.batch_size, a.workers, "dali",
                                                         a.device)),
        "coordl cpu backend": lambda: through(_loader(a.root, "train", a.batch_size, a.workers, "cpu")),
        f"plain dali ({mode})": lambda: _plain_dali(a.root, a.batch_size, a.workers, a.device),
    }
    for name, make in runs.items():
        result["speed"][name] = _timed(name, make(), a.epochs, started)
    result["seconds"] = time.monotonic() - started
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
