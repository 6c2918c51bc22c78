"""Microseconds per image for each step of coordl's `train` path, and three levers side by side.

    .venv/bin/python bench/experiments/steps.py /work/bench-data/photo --out bench/results/steps-photo

One core (`--cpu`), no profiler: each step of what a worker does per item
(pipelines/cpu.py's region-decoder path, in the same order) is timed with
`perf_counter_ns` around it, over `--files` items, for `--rounds` rounds;
the table gives the median over rounds of microseconds per image.

The levers run the same per-image loop with one step done the earlier way:
  rng      numpy SeedSequence + PCG64 + Generator draws  vs  random.Random (now)
  read     os.read with a fixed 1 MiB buffer until EOF   vs  one read of fstat's size (now)
  buffer   a fresh torch shared-memory batch buffer per batch (torch's way)
           vs  the same buffer reused (coordl/buffers.py, now)
Rounds interleave the variants (A B A B ...) so that other tenants hit both alike.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
from PIL import Image

import coordl
from coordl.cache.storage import localfile
from coordl.pipelines import cpu as cpu_pipeline
from coordl.pipelines import crop, roi

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for report.py
from lib import report  # noqa: E402

BATCH = 64
ns = time.perf_counter_ns


def _numpy_rng(seed: int, epoch: int, index: int):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence((seed, epoch, index))))


def _numpy_box(width: int, height: int, rng) -> tuple[int, int, int, int]:
    """crop.random_resized_crop_box with numpy's Generator API (the earlier code)."""
    area, log_lo, log_hi = width * height, math.log(3 / 4), math.log(4 / 3)
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    return 0, 0, width, height


def _read_1mib(path: str) -> bytes:
    """localfile.read_file before: a 1 MiB os.read until EOF."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def run_once(ds, idx: list[int], size: int, variant: str) -> dict[str, float]:
    """One pass over idx; returns total ns per step."""
    t: dict[str, float] = {}

    def add(key: str, dt: int) -> None:
        t[key] = t.get(key, 0) + dt

    pool = torch.UntypedStorage._new_shared(BATCH * size * size * 3)
    for b in range(0, len(idx), BATCH):
        t0 = ns()
        store = torch.UntypedStorage._new_shared(BATCH * size * size * 3) if variant == "buffer" else pool
        batch = torch.empty(0, dtype=torch.uint8).set_(store, 0, (BATCH, size, size, 3)).numpy()
        add("batch buffer (shared memory)", ns() - t0)
        for n, i in enumerate(idx[b:b + BATCH]):
            t0 = ns()
            path = ds.manifest.path(i)
            raw = _read_1mib(path) if variant == "read" else localfile.read_file(path)
            t1 = ns()
            add("read file", t1 - t0)
            w, h, _ok = roi.header(raw)
            t2 = ns()
            add("JPEG header", t2 - t1)
            if variant == "rng":
                rng = _numpy_rng(0, 0, i)
                box = _numpy_box(w, h, rng)
                flip = bool(rng.random() < 0.5)
            else:
                rng = crop.item_rng(0, 0, i)
                box = crop.random_resized_crop_box(w, h, rng)
                flip = crop.flip(rng)
            t3 = ns()
            add("RNG + crop box + flip draw", t3 - t2)
            pixels, rw, rh, sub = roi.decode_region(raw, box, size, (w, h), 4)
            t4 = ns()
            add("region decode (libjpeg-turbo, C)", t4 - t3)
            img = Image.frombuffer("RGBX", (rw, rh), pixels, "raw", "RGBX", 0, 1)
            left, top, bw, bh = sub
            small = img.resize((size, size), cpu_pipeline.BILINEAR, box=(left, top, left + bw, top + bh))
            t5 = ns()
            add("resize to 224 (pillow-simd)", t5 - t4)
            if flip:
                small = small.transpose(cpu_pipeline.FLIP_LEFT_RIGHT)
            packed = np.frombuffer(small.tobytes("raw", "RGB"), dtype=np.uint8)
            t6 = ns()
            add("flip + pack RGBX -> RGB", t6 - t5)
            batch[n].reshape(-1)[:] = packed
            add("copy into the batch buffer", ns() - t6)
    return t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root")
    p.add_argument("--files", type=int, default=640)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cpu", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    os.sched_setaffinity(0, {a.cpu})
    ds = coordl.ImageFolder(a.root, "train")
    idx = list(range(0, len(ds), max(1, len(ds) // a.files)))[:a.files]
    size = ds.size
    variants = ["now", "rng", "read", "buffer"]
    for v in variants:  # warm-up: page cache, allocator pools
        run_once(ds, idx[:BATCH], size, v)
    per: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(a.rounds):
        for v in variants:
            per[v].append({k: x / len(idx) / 1000 for k, x in run_once(ds, idx, size, v).items()})
        print(f"[round {r + 1}] " + "  ".join(f"{v} {sum(per[v][-1].values()):.0f} us" for v in variants),
              file=sys.stderr)

    def med(v: str, key: str | None = None) -> float:
        return statistics.median(sum(x.values()) if key is None else x[key] for x in per[v])

    steps = list(per["now"][0])
    lines = [
        "# Per-image time of each step, coordl `train` (one core)", "",
        f"Command: `{report.command()}`", "",
        f"{len(idx)} files of {report.portable(a.root)}, output {size}x{size}, batches of {BATCH}; "
        f"median of {a.rounds} rounds.", "",
        "| step | us / image | share |", "|---|---:|---:|",
    ]
    total = med("now")
    for key in steps:
        lines.append(f"| {key} | {med('now', key):.1f} | {med('now', key) / total * 100:.1f}% |")
    lines += [f"| **total** | **{total:.1f}** | |", "",
              "## Levers: the earlier way of one step, same loop", "",
              "| lever | step | earlier (us/img) | now (us/img) | saved (us/img) |", "|---|---|---:|---:|---:|"]
    lever_step = {"rng": "RNG + crop box + flip draw", "read": "read file", "buffer": None}
    result = {"steps": {k: med("now", k) for k in steps}, "total": total, "levers": {}}
    for v, key in lever_step.items():
        if key is None:  # the buffer lever moves cost between two steps: report both
            keys = ["batch buffer (shared memory)", "copy into the batch buffer"]
            before, after = sum(med(v, k) for k in keys), sum(med("now", k) for k in keys)
            key = " + ".join(keys)
        else:
            before, after = med(v, key), med("now", key)
        result["levers"][v] = {"step": key, "before": before, "after": after}
        lines.append(f"| {v} | {key} | {before:.1f} | {after:.1f} | {before - after:.1f} |")
    report.write(a.out, {"command": report.command(), **result}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
