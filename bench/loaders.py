"""The loader benchmark: coordl against what users run instead, side by side, one run.

    .venv/bin/python bench/loaders.py /work/bench-data/photo --out bench/results/loaders-photo

Loaders (each in its own process, started once, warm-up epoch first):

  coordl        coordl.DataLoader(coordl.ImageFolder(root, "train"), num_workers=W)
  torch-pillow  torch.utils.data.DataLoader + torchvision-style Dataset, plain Pillow
  torch-simd    the same with pillow-simd
  dali          DALI CPU: readers.file -> decoders.image_random_crop (fused) -> resize
                -> crop_mirror_normalize(UINT8), device_id=None, num_threads=W
  dali-tuned    the same pipeline with DALI's recommended throughput settings
  coordl-dali   coordl.DataLoader(..., backend="dali"): DALI CPU (image_slice -> resize ->
                crop_mirror_normalize) fed bytes by coordl's reader, num_threads=W
  coordl-accelerate  the coordl loader after accelerate's Accelerator(cpu=True).prepare()
  coordl-before  the coordl loader of an earlier commit (bench/lib/before.py builds it into
                .venv/coordl-before; its commit is in .venv/coordl-before/COMMIT)
  floor         full decode (Image.open(path).load()) of every file on ONE core;
                the decode floor is that rate x the number of cores
  floor-parallel  the same decode by one process per core at once, measured (shows
                what sharing caches and memory bandwidth costs two cores)

Then rounds: every loader runs one epoch in turn (A B C D ...), `--repeats`
times. Reported: per-loader median images/s with min and max, and the median
of the per-round ratios of coordl to each baseline; worker RSS after every
epoch (flat = no copy-on-access growth). Everything shares one CPU set
(`os.sched_setaffinity`, inherited by every child), one batch size, one
worker count and one dataset.

A tiny run (tests/bench/test_bench_smoke.py): a small dataset, `--repeats 1 --settle 0`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from lib import report

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PLAIN_PILLOW = os.path.join(REPO, ".venv", "plain-pillow")
BEFORE = os.path.join(REPO, ".venv", "coordl-before")

LOADERS = {
    "coordl": ["--loader", "coordl", "--expect-pil", "simd"],
    "torch-pillow": ["--loader", "torch", "--pil-path", PLAIN_PILLOW, "--expect-pil", "plain"],
    "torch-simd": ["--loader", "torch", "--expect-pil", "simd"],
    "dali": ["--loader", "dali", "--dali-variant", "fused"],
    "dali-tuned": ["--loader", "dali", "--dali-variant", "tuned"],
    "coordl-dali": ["--loader", "coordl-dali", "--expect-pil", "simd"],
    "coordl-accelerate": ["--loader", "coordl-accelerate", "--expect-pil", "simd"],
    "coordl-before": ["--loader", "coordl", "--expect-pil", "simd", "--coordl-path", BEFORE],
    "floor": ["--loader", "floor", "--expect-pil", "simd"],
    "floor-parallel": ["--loader", "floor-parallel", "--expect-pil", "simd"],
}
# the worker-count lever: coordl with other worker counts (last --workers wins)
for _w in (1, 3, 4):
    LOADERS[f"coordl-w{_w}"] = ["--loader", "coordl", "--expect-pil", "simd", "@workers", str(_w)]


class Child:
    """One loader process, driven one epoch at a time over its stdin/stdout."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "lib", "loader_child.py"), *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            sys.exit(f"loader {self.name} exited with status {code} (its stderr is above)")
        return json.loads(line)

    def epoch(self) -> dict:
        self.proc.stdin.write("epoch\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _rate(name: str, result: dict, cores: int) -> float:
    """Images/s of one epoch, charged with the CPU the loader used between epochs.

    A loader that keeps working while the others are timed (DALI prefetches
    the next epoch) gets that CPU time added as if spread over all cores:
    seconds + cpu_between_epochs / cores. For loaders whose workers idle
    between epochs this adds (almost) nothing.
    """
    if name == "floor":
        return result["images"] / result["seconds"] * cores
    return result["images"] / (result["seconds"] + result["cpu_between_epochs"] / cores)


def _raw_rate(result: dict) -> float:
    return result["images"] / result["seconds"]


def run(a: argparse.Namespace) -> dict:
    cpus = sorted(os.sched_getaffinity(0)) if a.cpus is None else [int(c) for c in a.cpus.split(",")]
    os.sched_setaffinity(0, cpus)
    names = a.loaders.split(",")
    a.root = os.path.abspath(a.root)
    common = ["--root", a.root, "--batch-size", str(a.batch_size), "--workers", str(a.workers),
              "--floor-cpu", str(cpus[0])]
    children = {}
    try:
        for n in names:
            print(f"[start] {n}", flush=True)
            argv = [a.before_dir if v == BEFORE else v for v in LOADERS[n]] + common
            if "@workers" in argv:  # move the override after the common --workers
                k = argv.index("@workers")
                argv = argv[:k] + argv[k + 2:] + ["--workers", argv[k + 1]]
            children[n] = Child(n, argv)
        epochs: dict[str, list[dict]] = {n: [] for n in names}
        for n in names:  # warm-up: worker start, page cache, first-touch
            warm = children[n].epoch()
            print(f"[warm-up] {n:13s} {_rate(n, warm, len(cpus)):7.0f} images/s", flush=True)
            epochs[n].append({**warm, "warmup": True})
            time.sleep(a.settle)
        for r in range(a.repeats):
            for n in names:
                res = children[n].epoch()
                epochs[n].append({**res, "warmup": False})
                print(f"[round {r + 1}] {n:13s} {_rate(n, res, len(cpus)):7.0f} images/s", flush=True)
                time.sleep(a.settle)
    finally:
        for c in children.values():
            c.close()
    return summarise(a, cpus, names, children, epochs)


def summarise(a, cpus, names, children, epochs) -> dict:
    rates = {n: [_rate(n, e, len(cpus)) for e in epochs[n] if not e["warmup"]] for n in names}
    loaders = {}
    for n in names:
        loaders[n] = {
            "median": statistics.median(rates[n]), "min": min(rates[n]), "max": max(rates[n]),
            "per_round": rates[n], "images_per_epoch": epochs[n][-1]["images"],
            "uncharged_median": statistics.median(
                _raw_rate(e) for e in epochs[n] if not e["warmup"]),
            "cpu_between_epochs": [e["cpu_between_epochs"] for e in epochs[n]],
            "cpu_seconds": [e["cpu_seconds"] for e in epochs[n]],
            "main_cpu_seconds": [e.get("main_cpu_seconds") for e in epochs[n]],
            "pil": children[n].ready.get("pil"),
            "coordl_from": children[n].ready.get("coordl_from"),
            "rss_per_epoch": [e["rss"] for e in epochs[n]],
        }
    ratios = {}
    if "coordl" in names:
        for b in names:
            if b != "coordl":
                per = [x / y for x, y in zip(rates["coordl"], rates[b])]
                ratios[f"coordl/{b}"] = {"median": statistics.median(per), "min": min(per),
                                         "max": max(per), "per_round": per}
    plain = {"plain Pillow (torch-pillow)": children["torch-pillow"].ready.get("pil")} \
        if "torch-pillow" in children else {}
    return {
        "command": report.command(),
        "machine": report.machine(cpus), "dataset": report.dataset(a.root),
        "versions": report.versions(plain), "batch_size": a.batch_size, "workers": a.workers,
        "repeats": a.repeats, "floor_note": f"full decode on one core x {len(cpus)} cores",
        "loaders": loaders, "ratios": ratios,
        "before_commit": _before_commit(a.before_dir) if "coordl-before" in names else None,
    }


def _before_commit(directory: str) -> str:
    with open(os.path.join(directory, "COMMIT")) as f:
        return f.read().strip()


def _rss_line(loader: dict) -> str:
    per = loader["rss_per_epoch"]
    if not per or not per[0]["workers"]:
        main = [e["main"] / 2**20 for e in per]
        return f"main {main[0]:.0f} -> {main[-1]:.0f} MiB"
    first, last = per[0]["workers"], per[-1]["workers"]
    text = ", ".join(f"{a / 2**20:.0f} -> {b / 2**20:.0f}" for a, b in zip(first, last)) + " MiB"
    if per[0].get("workers_private"):
        first, last = per[0]["workers_private"], per[-1]["workers_private"]
        text += " (private " + ", ".join(f"{a / 2**20:.0f} -> {b / 2**20:.0f}" for a, b in zip(first, last)) + ")"
    return text


def markdown(r: dict) -> str:
    m, d = r["machine"], r["dataset"]
    lines = [
        f"Machine: {m['cpu_model']}, {m['cores_used']} cores used (ids {m['cpu_ids']}), AVX2 {m['avx2']}.  ",
        f"Dataset: {d['root']}, {d['files']} files, mean {d['mean_bytes'] / 1024:.1f} KiB.  ",
        f"Batch {r['batch_size']}, {r['workers']} workers/threads, {r['repeats']} interleaved rounds "
        "after one warm-up epoch each.  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".  ",
        f"Command: `{r['command']}`",
        *([f"coordl-before: coordl at commit {r['before_commit']} (bench/lib/before.py)."]
          if r.get("before_commit") else []),
        "",
        "images/s of a loader = images / (epoch seconds + CPU seconds it used between its epochs "
        "/ cores); floor = full-decode images/s on one core x cores. CPU ms/image = user+system "
        "CPU of the loader's process and its workers per image (less sensitive to other tenants "
        "than images/s). Worker RSS includes shared-memory batch buffers a worker keeps for reuse "
        "(coordl: at most prefetch_factor + 3 per worker, so it can grow by a few buffers until the "
        "pool is full); private = RssAnon, the worker's own memory.",
        "",
        "| loader | median images/s | min | max | coordl / this (median of per-round ratios) "
        "| CPU ms/image (all processes) | worker RSS first -> last epoch |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, lo in r["loaders"].items():
        ratio = r["ratios"].get(f"coordl/{name}")
        rtxt = (f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else "")
        label = name + (" (x cores)" if name == "floor" else "")
        cpu_ms = statistics.median(c / lo["images_per_epoch"] * 1e3 for c in lo["cpu_seconds"][1:])
        lines.append(f"| {label} | {lo['median']:.0f} | {lo['min']:.0f} | {lo['max']:.0f} | {rtxt} "
                     f"| {cpu_ms:.2f} | {_rss_line(lo)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="an ImageFolder (coordl make-dataset)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cpus", default=None, help="comma-separated CPU ids (default: all usable)")
    p.add_argument("--loaders", default=",".join(n for n in LOADERS
                                                 if not n.startswith("coordl-w") and n != "coordl-before"),
                   help=f"comma-separated, from: {', '.join(LOADERS)}")
    p.add_argument("--settle", type=float, default=1.0, help="seconds idle between epochs")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    p.add_argument("--before-dir", default=BEFORE, help="where bench/lib/before.py installed the earlier coordl")
    a = p.parse_args()
    result = run(a)
    report.write(a.out, result, markdown(result))


if __name__ == "__main__":
    main()
