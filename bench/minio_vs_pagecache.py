#!/usr/bin/env python3
"""MinIO static cache vs the OS page cache at the same memory budget.

For each cache fraction f of the dataset (D bytes) and each side, one child
process runs `coordl.DataLoader` (train transform, shuffled, a fresh order
every epoch, persistent workers) for several epochs and reports, per epoch,
the bytes it read from storage (``/proc/<pid>/io`` read_bytes summed over the
loader process and its workers; the blkio cgroup's io_service_bytes as a
cross-check) and the epoch time.

- page cache: the child runs in a memory cgroup (v1) whose
  ``memory.limit_in_bytes`` is the loader's own peak footprint (measured by a
  calibration run whose reads leave no page cache: rss + shmem of the cgroup at
  the end of an epoch) + a small slack + f x D, so that the page cache gets
  about f x D. The table shows the page cache it actually held.
- MinIO: same cgroup limit; ``cache=f x D`` and storage reads that drop their
  pages (``posix_fadvise(DONTNEED)``, the default with a cache). The cache
  segment (f x D) is created by this bench process before the run, outside the
  loader's cgroup, as a node-wide cache made by another job would be, and the
  loader attaches to it: the loader's cgroup then holds the same footprint
  as the page-cache run, and MinIO's memory is exactly f x D. (Charging the
  segment to the loader's cgroup would leave no room for the loader's start-up
  peak, which is above its steady footprint, and the OOM killer would end it.)
- Storage is throttled with ``blkio.throttle.read_bps_device`` on the disk
  that holds the dataset (``--throttle-mbps``, 0: off), so that epoch times
  reflect a disk-bound job. Before every run the dataset's pages are dropped
  from the page cache (``posix_fadvise(DONTNEED)`` on every file).

Dataset size: the memory limit leaves the page cache f x D plus the slack
(--slack-mib, 32 MiB), so the dataset must be well above what that lets the
page cache hold, or the page cache holds (nearly) all of it and looks better
than MinIO: the opposite of the result on a dataset larger than the cache's
memory (a 60 MB set gives it). Needed: D >= 2 x slack / (1 - largest f), 256
MiB for the defaults (`coordl make-dataset DIR --images 3000`: ~300 MiB); the
bench prints a warning and notes it in OUT.md when the set is smaller.

Needs root and cgroup v1 memory + blkio controllers; it says so and stops
(page cache side) when they are missing. A tiny run: a small dataset,
`--fractions 0.5 --epochs 2 --throttle-mbps 0`. Run it under the bench lock:

    flock /tmp/coordl-bench.lock .venv/bin/python bench/minio_vs_pagecache.py \\
        --data /work/bench-data/minio --out bench/results/minio
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from lib import cgroup, pagecache, report

SIDES = ("pagecache", "minio")
MiB = 2**20


# -- the child: one loader, several epochs ---------------------------------------------

def child(args) -> None:
    cgroup.join(args.join.split(",") if args.join else [])
    import psutil
    import torch

    import coordl

    ds = coordl.ImageFolder(args.data, transform="train", size=224, seed=args.seed)
    total = ds.manifest.total_bytes
    kw = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
              persistent_workers=args.workers > 0, generator=torch.Generator().manual_seed(args.seed))
    if args.side == "minio":
        loader = coordl.DataLoader(ds, cache=int(args.fraction * total), **kw)
    else:  # "pagecache", or "calibrate": the loader's footprint without page cache
        loader = coordl.DataLoader(ds, drop_page_cache=args.side == "calibrate", **kw)
    mem_stat = os.path.join(cgroup.base_dir("memory"), "memory.stat")
    me = psutil.Process()
    try:
        for epoch in range(args.epochs):
            pids = [me.pid] + [c.pid for c in me.children(recursive=True)]
            before, stats0, t0 = pagecache.read_bytes(pids), loader.stats(), time.perf_counter()
            for _ in loader:
                pass
            seconds = time.perf_counter() - t0
            pids = [me.pid] + [c.pid for c in me.children(recursive=True)]
            stats, mem = loader.stats(), cgroup.read_stat(mem_stat)
            print(json.dumps({
                "epoch": epoch, "seconds": round(seconds, 3), "read_bytes": pagecache.read_bytes(pids) - before,
                "storage_bytes": stats["storage_bytes"] - stats0["storage_bytes"],
                "cache_hits": stats["cache_hits"] - stats0["cache_hits"],
                "cache_bytes": stats.get("cache_bytes", 0),
                "page_cache_bytes": mem.get("cache", 0) - mem.get("shmem", 0),
                "shmem_bytes": mem.get("shmem", 0), "rss_bytes": mem.get("rss", 0),
            }), flush=True)
    finally:
        if ds.cache is not None:
            ds.cache.close()  # the orchestrator made it and drops it


# -- the orchestrator --------------------------------------------------------------------

def _run_child(args, side: str, fraction: float, cg: cgroup.Cgroup, epochs: int) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--side", side, "--fraction", str(fraction),
           "--data", args.data, "--epochs", str(epochs), "--workers", str(args.workers),
           "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--join", ",".join(cg.procs_files)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd="/")
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0:
        oom = cgroup.read_stat(os.path.join(cg.memory, "memory.oom_control")).get("oom_kill", 0)
        raise SystemExit(f"bench: {side} f={fraction} child failed (exit {proc.returncode}"
                         f"{', killed by the OOM killer' if oom else ''}) after {len(rows)} epochs")
    return rows


def _facts(args, ds) -> dict:
    from coordl.cli.info import collect

    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    sizes = ds.manifest.sizes
    return {"cpu": model, **collect(), "kernel": os.uname().release,
            "memory_total": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "dataset": {"root": report.portable(ds.root), "files": len(ds), "bytes": ds.manifest.total_bytes,
                        "mean_bytes": round(float(sizes.mean()))},
            "command": report.command()}


def size_needed(fractions: list[float], slack_bytes: int) -> int:
    """The smallest dataset (bytes) this comparison means something on: each run lets the page cache
    hold f x D + slack, which must stay well below D at the largest f (twice the slack below it)."""
    return int(2 * slack_bytes / (1 - max(fractions)))


def size_warning(total: int, fractions: list[float], slack_bytes: int) -> str | None:
    """The warning for a dataset too small for the comparison, or None."""
    need = size_needed(fractions, slack_bytes)
    if total >= need:
        return None
    f = max(fractions)
    held = (f * total + slack_bytes) / MiB
    return (f"WARNING: the dataset ({total / MiB:.1f} MiB) is too small for this comparison: each run lets the "
            f"page cache hold f x dataset + the {slack_bytes / MiB:.0f} MiB slack ({held:.0f} "
            f"MiB at f={f:.2f}), so it keeps most or all of the dataset and can read less than MinIO, the "
            "opposite of the result on a dataset larger than the cache's memory. Use a dataset of at least "
            f"{need / MiB:.0f} MiB (2 x slack / (1 - largest fraction)), e.g. `coordl make-dataset DIR --images "
            f"{max(3000, int(need / (100 * 1024)) + 1)}` (~100 KiB per image).")


def orchestrate(args) -> None:
    import coordl

    ds = coordl.ImageFolder(args.data)
    paths = [ds.manifest.path(i) for i in range(len(ds))]
    total = ds.manifest.total_bytes
    facts = _facts(args, ds)
    too_small = size_warning(total, args.fractions, args.slack_mib * MiB)
    if too_small:
        print(f"bench: {too_small}", flush=True)
    problems = {c: cgroup.why_not(c, knob) for c, knob in
                (("memory", "memory.limit_in_bytes"), ("blkio", "blkio.throttle.read_bps_device"))}
    if problems["memory"]:
        raise SystemExit(f"bench: cannot limit the page cache: {problems['memory']}. Without a memory "
                         "cgroup the page cache would hold the whole dataset and the comparison means "
                         "nothing; run as root on a machine with cgroup v1 memory.")
    throttle = None
    if args.throttle_mbps > 0:
        if problems["blkio"]:
            print(f"bench: storage NOT throttled: {problems['blkio']}", flush=True)
        else:
            throttle = (cgroup.disk_of(args.data), int(args.throttle_mbps * MiB))
    tag = f"coordl-bench-{os.getpid()}"

    pagecache.evict(paths)
    with cgroup.Cgroup(tag, blkio=throttle is not None, read_bps=throttle) as cg:
        calib = _run_child(args, "calibrate", 0.0, cg, 2)
        peak = cg.max_usage()
    footprint = max(e["rss_bytes"] + e["shmem_bytes"] for e in calib)  # steady state, no page cache
    limit_extra = footprint + args.slack_mib * MiB
    print(f"bench: loader footprint without page cache {footprint / MiB:.0f} MiB (peak usage "
          f"{peak / MiB:.0f} MiB; calibration epochs {[e['seconds'] for e in calib]} s); "
          f"limit = footprint + {args.slack_mib} MiB + f x D", flush=True)

    runs = []
    for fraction in args.fractions:
        for side in SIDES:
            pagecache.evict(paths)
            limit = limit_extra + int(fraction * total)
            cache = coordl.MinIOCache(int(fraction * total)) if side == "minio" else None
            try:
                if cache is not None:
                    cache.open(ds.fingerprint, len(ds), ds.root)
                with cgroup.Cgroup(tag, memory_limit=limit, blkio=throttle is not None,
                                   read_bps=throttle) as cg:
                    epochs = _run_child(args, side, fraction, cg, args.epochs)
            finally:
                if cache is not None:
                    cache.drop()
            for e in epochs:
                e["read_fraction"] = round(e["read_bytes"] / total, 4)
            runs.append({"side": side, "fraction": fraction, "memory_limit": limit, "epochs": epochs})
            later = epochs[1:]
            print(f"bench: f={fraction:.2f} {side:9s} read/epoch after the first: "
                  + ", ".join(f"{e['read_fraction']:.1%}" for e in later)
                  + "; s/epoch: " + ", ".join(f"{e['seconds']:.1f}" for e in later), flush=True)
    pagecache.evict(paths)

    result = {**facts, "settings": {"fractions": args.fractions, "epochs": args.epochs,
                                    "workers": args.workers, "batch_size": args.batch_size,
                                    "transform": "train 224", "seed": args.seed,
                                    "throttle": f"{args.throttle_mbps} MiB/s on {throttle[0]}" if throttle
                                    else f"none ({problems['blkio'] or 'off'})",
                                    "footprint_bytes": footprint, "slack_bytes": args.slack_mib * MiB,
                                    "dataset_bytes_needed": size_needed(args.fractions, args.slack_mib * MiB),
                                    "too_small": too_small},
              "runs": runs}
    report.write(args.out, result, markdown(result))


def _mean(xs):
    return sum(xs) / len(xs)


def markdown(r: dict) -> str:
    s, d = r["settings"], r["dataset"]
    lines = [
        "# MinIO vs the OS page cache at the same memory budget", "",
        f"Dataset: {d['files']} JPEGs, {d['bytes'] / MiB:.1f} MiB (mean {d['mean_bytes'] / 1024:.1f} KiB), "
        f"{d['root']}. Loader: coordl.DataLoader, transform {s['transform']}, batch {s['batch_size']}, "
        f"{s['workers']} workers, shuffled (new order each epoch), {s['epochs']} epochs "
        "(the first fills the cache). Storage throttle: " + s["throttle"] + ".",
        f"Memory budget of each run: cgroup v1 memory.limit_in_bytes = loader footprint "
        f"({s['footprint_bytes'] / MiB:.0f} MiB, measured) + {s['slack_bytes'] / MiB:.0f} MiB slack "
        "+ fraction x dataset, the same for both sides; MinIO's segment (fraction x dataset) is made "
        "outside that cgroup before the run, so its loader holds only its footprint and each cache gets "
        "about fraction x dataset (the page cache's actual share is in the table). Bytes read: "
        "/proc/<pid>/io read_bytes of the loader and its workers.", "",
        "| cache fraction | page cache: storage read / epoch | MinIO: storage read / epoch | static ideal "
        "| page cache held (mean) | page cache: s / epoch | MinIO: s / epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(run["fraction"], run["side"]): run["epochs"][1:] for run in r["runs"]}
    for f in s["fractions"]:
        pc, mi = by[(f, "pagecache")], by[(f, "minio")]

        def rng(es, key="read_fraction"):
            xs = [e[key] for e in es]
            return f"{_mean(xs):.1%} ({min(xs):.1%}-{max(xs):.1%})"

        held = _mean([e["page_cache_bytes"] for e in pc]) / d["bytes"]
        lines.append(f"| {f:.2f} | {rng(pc)} | {rng(mi)} | {1 - f:.0%} | {held:.0%} of dataset "
                     f"| {_mean([e['seconds'] for e in pc]):.1f} | {_mean([e['seconds'] for e in mi]):.1f} |")
    logical = ", ".join(
        f"{_mean([e['storage_bytes'] for e in by[(f, 'minio')]]) / d['bytes']:.1%} at {f:.2f}"
        for f in s["fractions"])
    lines += ["", "Per epoch after the first: mean (min-max) of the epochs. "
              "Each run starts with the dataset's pages dropped from the page cache. "
              f"MinIO's file bytes read per epoch (coordl's storage_bytes counter): {logical}; "
              "the kernel's read_bytes is higher by each file's rounding up to whole 4 KiB pages.", "",
              f"Machine: {r['cpu']}, {r['cpus']} CPUs, {r['memory_total'] / 2**30:.1f} GiB RAM, "
              f"kernel {r['kernel']}; python {r['python']}, torch {r['torch']}, numpy {r['numpy']}, "
              f"{r['pillow']}.", "", "Command:", "", "    " + r["command"], ""]
    if s.get("too_small"):
        lines += [f"**{s['too_small']}**", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=(
        "Dataset size: each run lets the page cache hold f x dataset + --slack-mib; on a smaller dataset "
        "than 2 x slack / (1 - largest fraction) (256 MiB with the defaults) the page cache holds most of it "
        "and the result is the opposite of a large dataset's: the bench warns. Use e.g. `coordl make-dataset "
        "DIR --images 3000` (~300 MiB)."))
    ap.add_argument("--data", help="ImageFolder root (coordl make-dataset DIR ...)")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run; the first fills the cache")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--throttle-mbps", type=float, default=100.0, help="storage read limit, MiB/s (0: none)")
    ap.add_argument("--slack-mib", type=int, default=32, help="memory above the measured footprint (the page "
                    "cache may use it too: the dataset must be >= 2 x slack / (1 - largest fraction))")
    ap.add_argument("--out", default="bench/results/minio", help="writes OUT.json and OUT.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--side", choices=SIDES + ("calibrate",), help=argparse.SUPPRESS)
    ap.add_argument("--fraction", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--join", default="", help=argparse.SUPPRESS)
    ap.add_argument("--report", metavar="JSON", help="only rewrite the Markdown table of a stored JSON")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            md = markdown(json.load(f))
        with open(args.report.removesuffix(".json") + ".md", "w") as f:
            f.write(md)
        return
    if not args.data:
        ap.error("--data DIR is required (an ImageFolder, e.g. made with coordl make-dataset)")
    args.data = os.path.abspath(args.data)
    child(args) if args.child else orchestrate(args)


if __name__ == "__main__":
    main()
