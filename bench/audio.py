"""The audio benchmark: coordl.AudioFolder against what a user writes with torch and soundfile.

    .venv/bin/python bench/audio.py --data $BENCH_DATA/audio --files 400 --out bench/results/audio

Makes (once) a class-folder set of noise and tone clips: `--clip-seconds` long,
mono, half WAV (float) and half FLAC (16-bit), every fourth file at 44.1 kHz (of
both formats; the rest at the 16 kHz target). Then both loaders, on the same files, the same
workers, batch size and window (1 s, "train": a random window per item):

  coordl  coordl.DataLoader(coordl.AudioFolder(root, 16000, 1.0, "train"), num_workers=W)
  torch   torch.utils.data.DataLoader over a Dataset that does what a user writes:
          soundfile.read(path) of the whole file, soxr.resample when the rate differs,
          a random window (numpy), zero padding, torch.from_numpy(...)

Each is built once and warmed up by one epoch; then `--rounds` rounds of one
epoch each, interleaved (coordl, torch, coordl, torch, ...). Reported: clips/s
per loader (median, min, max) and the median of the per-round ratios
coordl / torch. On a shared machine the figures are noisy: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import soundfile as sf
import soxr
import torch

import coordl

RATE, OTHER_RATE = 16000, 44100


def make_data(root: str, files: int, clip_seconds: float, seed: int = 0) -> None:
    """`files` clips in root/noise and root/tone (kept if the folder already holds that many)."""
    done = os.path.join(root, f".made-v2-{files}-{clip_seconds}")
    if os.path.exists(done):
        return
    rng = np.random.default_rng(seed)
    for k in range(files):
        cls = ("noise", "tone")[k % 2]
        rate = OTHER_RATE if k % 4 == 3 else RATE
        n = int(rate * clip_seconds)
        if cls == "noise":
            data = rng.uniform(-0.5, 0.5, n).astype(np.float32)
        else:
            data = (0.5 * np.sin(2 * np.pi * rng.uniform(100, 2000) * np.arange(n) / rate)).astype(np.float32)
        fmt, subtype = (("WAV", "FLOAT"), ("FLAC", "PCM_16"))[(k // 4) % 2]
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        sf.write(os.path.join(root, cls, f"{k:06d}.{fmt.lower()}"), data, rate, format=fmt, subtype=subtype)
    open(done, "w").close()


class SoundfileFolder(torch.utils.data.Dataset):
    """The baseline: what a user writes with soundfile (and soxr) for the same windows."""

    def __init__(self, root: str, sample_rate: int = RATE, seconds: float = 1.0) -> None:
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, f), label) for label, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c))) if f.endswith((".wav", ".flac"))]
        self.sample_rate, self.length = sample_rate, int(round(sample_rate * seconds))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        data, rate = sf.read(path, dtype="float32", always_2d=True)
        if rate != self.sample_rate:
            data = soxr.resample(data, rate, self.sample_rate)
        if len(data) > self.length:
            start = np.random.randint(0, len(data) - self.length + 1)
            data = data[start:start + self.length]
        out = np.zeros((data.shape[1], self.length), dtype=np.float32)
        out[:, :len(data)] = data.T
        return torch.from_numpy(out), label


def epoch_rate(loader) -> tuple[float, int]:
    start, clips = time.perf_counter(), 0
    for waves, _ in loader:
        clips += len(waves)
    return clips / (time.perf_counter() - start), clips


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder for the generated clips (made once)")
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--clip-seconds", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    for name in ("files", "workers", "batch_size", "rounds"):
        if getattr(args, name) < (0 if name == "workers" else 1):
            ap.error(f"--{name.replace('_', '-')}={getattr(args, name)} is too small")
    root = os.path.abspath(args.data)
    make_data(root, args.files, args.clip_seconds)
    common = {"batch_size": args.batch_size, "shuffle": True, "num_workers": args.workers,
              "persistent_workers": args.workers > 0}
    loaders = {
        "coordl": coordl.DataLoader(coordl.AudioFolder(root, RATE, 1.0, "train", manifest_cache="off"), **common),
        "torch": torch.utils.data.DataLoader(SoundfileFolder(root), **common),
    }
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    for loader in loaders.values():  # warm-up: workers start, files enter the page cache
        epoch_rate(loader)
    for _ in range(args.rounds):
        for name, loader in loaders.items():
            rate, clips = epoch_rate(loader)
            if clips != args.files:
                raise SystemExit(f"{name} gave {clips} clips in an epoch, not {args.files}")
            rates[name].append(rate)
    ratios = [c / t for c, t in zip(rates["coordl"], rates["torch"])]
    result = {
        "files": args.files, "clip_seconds": args.clip_seconds, "resampled_fraction": 0.25,
        "workers": args.workers, "batch_size": args.batch_size, "rounds": args.rounds,
        "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
        "soundfile": sf.__version__, "soxr": soxr.__version__, "coordl": coordl.__version__,
        "clips_per_s": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in rates.items()},
        "ratio_coordl_to_torch": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "stats_coordl_total": loaders["coordl"].stats(),
    }
    lines = ["| loader | clips/s median (min-max) |", "|---|---|"]
    lines += [f"| {k} | {v['median']:.0f} ({v['min']:.0f}-{v['max']:.0f}) |" for k, v in result["clips_per_s"].items()]
    r = result["ratio_coordl_to_torch"]
    lines.append(f"\ncoordl / torch: {r['median']:.2f} (per-round {r['min']:.2f}-{r['max']:.2f}); "
                 f"{args.files} clips of "
                 f"{args.clip_seconds} s, a quarter at 44.1 kHz, 1 s windows at 16 kHz, {args.workers} workers, "
                 f"batch {args.batch_size}, {result['cores']} cores, {args.rounds} rounds after a warm-up epoch")
    print("\n".join(lines))
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write("# bench/audio.py\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
