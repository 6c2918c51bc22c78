#!/usr/bin/env python3
"""The sharing curve: N = 1, 2, 4, 8 jobs of mixed batch sizes at one `coordl serve` daemon.

Each job is its own process, `coordl.DataLoader(ImageFolder(DATA, transform="train"),
batch_size=B, shuffle=True, coordinator=...)`, with its own B (default 64, 256, 32, 128,
48, 192, 96, 160: job j of a run of N is the j-th), and after every batch sleeps
B x `--compute-ms` ms: a GPU step that leaves the CPUs free and whose time grows with
the batch. The daemon prepares chunks of `--chunk` samples once per epoch for all the
jobs (issue 37). Per N, and per job alone (the same batch size, the only job at the
daemon):

- CPU seconds per epoch of the daemon (its process and prep workers: their CPU from the
  moment it listens until it exits, `os.wait4`'s rusage minus psutil's cpu_times at
  the start) plus every job (`time.process_time()` from its loader's creation, before it
  attaches, to its last batch; imports excluded), against N = 1: `--repeats` rounds, each
  running every N once (interleaved, so that the machine's drift falls on all of them), and
  per N the median of the rounds' ratios to their own N = 1, with min and max;
- storage bytes and decodes per epoch: the daemon's own counters
  (`storage_bytes`, `decodes` of `Client.stats()`), against N = 1;
- each job's images/s (its images / time from receiving its first batch to the end of its
  last step, which includes every step's compute) against the same job alone;
  `compute-bound` is that rate over 1 / compute-ms, the rate of a job whose every batch
  is ready when asked for.

The daemon runs `--epochs E` and exits when every job has had them, so nothing is
prepared that no job takes. A tiny run: `--ns 1,2 --batch-sizes 8,16 --chunk 4 --size 32
--compute-ms 0 --epochs 1`. Run it under the bench lock:

    flock /tmp/coordl-bench.lock .venv/bin/python bench/sharing.py \\
        --data $BENCH_DATA/sharing --out bench/results/sharing
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from lib import report

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")


# -- one job (its own process) ---------------------------------------------------
def job_main(a) -> None:
    import coordl

    ds = coordl.ImageFolder(a.data, transform="train", size=a.size)
    loader = coordl.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                               coordinator="unix://" + a.socket)
    cpu0, ru0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
    images, batches, t_first, epoch_cpu = 0, 0, None, []
    for _ in range(a.epochs):
        epoch_cpu.append(time.process_time())
        for x, y in loader:
            int(y.sum()) + int(x[:, 0, 0, 0].sum())  # touch the batch, as a training step reads it
            batches += 1
            if t_first is None:
                t_first = time.monotonic()
            images += x.shape[0]
            if a.compute_ms:
                time.sleep(x.shape[0] * a.compute_ms / 1e3)
    t_end = time.monotonic()
    cpu, ru = time.process_time() - cpu0, resource.getrusage(resource.RUSAGE_SELF)
    epoch_cpu = [b - a for a, b in zip([cpu0, *epoch_cpu[1:]], [*epoch_cpu[1:], cpu0 + cpu])]
    stats = loader.coordinator.stats()
    span = t_end - (t_first or t_end)
    print("result " + json.dumps({
        "batch_size": a.batch_size, "images": images, "batches": batches, "cpu_s": cpu,
        "user_s": ru.ru_utime - ru0.ru_utime, "system_s": ru.ru_stime - ru0.ru_stime,
        "minor_faults": ru.ru_minflt - ru0.ru_minflt,
        "buffer_misses": loader.coordinator.out.misses, "epoch_cpu_s": epoch_cpu,
        "images_per_s": images / span if span > 0 else 0.0,
        "daemon_storage_bytes": stats["daemon_storage_bytes"], "daemon_decodes": stats["daemon_decodes"],
    }), flush=True)


# -- one run: a daemon and N jobs ----------------------------------------------------
def _tree_cpu(pid: int) -> float:
    """CPU seconds so far of a process, its reaped children and its live descendants."""
    import psutil

    p = psutil.Process(pid)
    t = p.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in p.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def _steady(epoch_cpu: list[float]) -> float:
    """A job's CPU seconds per epoch after its first (all of them for a run of one epoch)."""
    later = epoch_cpu[1:] or epoch_cpu
    return sum(later) / len(later)


def run(a, batch_sizes: list[int]) -> dict:
    """One daemon, len(batch_sizes) jobs started together; their results and the daemon's CPU."""
    with tempfile.TemporaryDirectory(prefix="cs-", dir="/tmp") as sockdir:
        sock = os.path.join(sockdir, "s.sock")
        argv = [COORDL, "serve", "--data", a.data, "--batch-size", str(a.chunk), "--size", str(a.size),
                "--workers", str(a.workers), "--slots", str(a.slots), "--socket", sock,
                "--epochs", str(a.epochs), "--min-jobs", str(len(batch_sizes)), "--join-window", "0"]
        daemon = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        jobs: list[subprocess.Popen] = []
        try:
            line = daemon.stdout.readline()
            if "listening" not in line:
                raise SystemExit(f"coordl serve did not start: {line!r}")
            cpu0 = _tree_cpu(daemon.pid)
            jobs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--job", "--data", a.data,
                                      "--socket", sock, "--batch-size", str(b), "--size", str(a.size),
                                      "--epochs", str(a.epochs), "--compute-ms", str(a.compute_ms)],
                                     stdout=subprocess.PIPE, text=True) for b in batch_sizes]
            results = []
            for job in jobs:
                out, _ = job.communicate(timeout=900)
                lines = [x for x in out.splitlines() if x.startswith("result ")]
                if job.returncode != 0 or not lines:
                    raise SystemExit(f"a job (batch {job.args[job.args.index('--batch-size') + 1]}) "
                                     f"exited {job.returncode} without a result")
                results.append(json.loads(lines[-1][len("result "):]))
            _, status, usage = os.wait4(daemon.pid, 0)  # the daemon exits: every job had its epochs
            daemon.returncode = os.waitstatus_to_exitcode(status)
        finally:
            for p in [*jobs, daemon]:
                if p.returncode is None and p.poll() is None:
                    p.kill()
                    p.wait()
    if daemon.returncode != 0:
        raise SystemExit(f"coordl serve exited {daemon.returncode}")
    daemon_cpu = usage.ru_utime + usage.ru_stime - cpu0
    jobs_cpu = sum(r["cpu_s"] for r in results)
    e = a.epochs
    return {"n": len(batch_sizes), "batch_sizes": batch_sizes, "jobs": results,
            "daemon_cpu_s_per_epoch": daemon_cpu / e, "jobs_cpu_s_per_epoch": jobs_cpu / e,
            "cpu_s_per_epoch": (daemon_cpu + jobs_cpu) / e,
            # a job's first epoch holds its start (attach, the first touch of its batch buffers): without it
            "steady_cpu_s_per_epoch": daemon_cpu / e + sum(_steady(r["epoch_cpu_s"]) for r in results),
            "storage_bytes_per_epoch": max(r["daemon_storage_bytes"] for r in results) / e,
            "decodes_per_epoch": max(r["daemon_decodes"] for r in results) / e}


# -- the whole benchmark -------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    ap.add_argument("--ns", default="1,2,4,8", help="jobs per run")
    ap.add_argument("--batch-sizes", default="64,256,32,128,48,192,96,160", help="job j's batch size")
    ap.add_argument("--chunk", type=int, default=32, help="the daemon's --batch-size (its chunks)")
    ap.add_argument("--compute-ms", type=float, default=4.0, help="ms of compute (sleep) per image of a step")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per job (a job's start, its attach and "
                    "its batch buffers, is spread over them)")
    ap.add_argument("--workers", type=int, default=2, help="the daemon's prep workers")
    ap.add_argument("--slots", type=int, default=16, help="the daemon's ring slots (chunks)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of every N, interleaved; per N the median "
                    "of each round's CPU ratio to that round's N = 1")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", default="", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        job_main(a)
        return
    ns = [int(n) for n in a.ns.split(",")]
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    if max(ns) > len(sizes):
        raise SystemExit(f"--ns {a.ns} needs {max(ns)} batch sizes, --batch-sizes has {len(sizes)}")
    solo: dict[int, dict] = {}
    for b in dict.fromkeys(sizes[:max(ns)]):  # each job alone, in the order they join
        solo[b] = run(a, [b])
        print(f"alone b={b}: {solo[b]['jobs'][0]['images_per_s']:.0f} images/s, "
              f"{solo[b]['cpu_s_per_epoch']:.2f} CPU s/epoch", flush=True)
    reps: list[dict[int, dict]] = []
    for rep in range(a.repeats):  # interleaved: every N once per repeat, N = 1 its own baseline each time
        reps.append({n: run(a, sizes[:n]) for n in ns})
        print(f"repeat {rep + 1}: " + ", ".join(
            f"N={n} {reps[-1][n]['cpu_s_per_epoch'] / reps[-1][ns[0]]['cpu_s_per_epoch']:.2f}x" for n in ns),
            flush=True)
    runs = []
    for n in ns:
        ratios = [rep[n]["cpu_s_per_epoch"] / rep[ns[0]]["cpu_s_per_epoch"] for rep in reps]
        k = sorted(range(len(reps)), key=lambda j: ratios[j])[(len(reps) - 1) // 2]  # the median repeat
        r, base = reps[k][n], reps[k][ns[0]]
        med = {key: sorted(rep[n][key] for rep in reps)[(len(reps) - 1) // 2]  # each N's own median over rounds
               for key in ("cpu_s_per_epoch", "daemon_cpu_s_per_epoch", "jobs_cpu_s_per_epoch")}
        steady = sorted(rep[n]["steady_cpu_s_per_epoch"] / rep[ns[0]]["steady_cpu_s_per_epoch"] for rep in reps)
        r = {**r, "cpu_ratio": ratios[k], "cpu_ratio_min": min(ratios), "cpu_ratio_max": max(ratios),
             "cpu_ratios": ratios, "repeat": k, "median": med, "steady_cpu_ratio": steady[(len(steady) - 1) // 2],
             "steady_cpu_ratio_min": steady[0], "steady_cpu_ratio_max": steady[-1],
             "storage_ratio": r["storage_bytes_per_epoch"] / base["storage_bytes_per_epoch"]}
        for job in r["jobs"]:
            job["vs_alone"] = job["images_per_s"] / solo[job["batch_size"]]["jobs"][0]["images_per_s"]
        runs.append(r)
        print(f"N={n}: CPU {r['cpu_ratio']:.2f}x (median of {len(reps)}; {min(ratios):.2f}-{max(ratios):.2f}), "
              f"after each job's first epoch {r['steady_cpu_ratio']:.2f}x, "
              f"storage {r['storage_ratio']:.2f}x, "
              f"min images/s vs alone {min(j['vs_alone'] for j in r['jobs']):.2f}x", flush=True)
    cfg = {k: getattr(a, k) for k in ("chunk", "compute_ms", "epochs", "workers", "slots", "size", "repeats")}
    result = {"machine": report.machine(sorted(os.sched_getaffinity(0))), "dataset": report.dataset(a.data),
              "versions": report.versions(), "command": report.command(), "config": cfg,
              "alone": {str(b): r for b, r in solo.items()}, "runs": runs}
    report.write(a.out, result, markdown(result))


def markdown(r: dict) -> str:
    m, d, c = r["machine"], r["dataset"], r["config"]
    bound = 1e3 / c["compute_ms"] if c["compute_ms"] else None
    lines = [
        f"Machine: {m['cpu_model']}, {m['cores_used']} cores used, kernel {m['kernel']}.  ",
        f"Dataset: {d['root']}, {d['files']} JPEGs, mean {d['mean_bytes'] / 1024:.1f} KiB.  ",
        f"One daemon: {c['workers']} prep workers, chunks of {c['chunk']}, {c['slots']} slots; train transform "
        f"to uint8 {c['size']}x{c['size']}; {c['epochs']} epochs per job; compute {c['compute_ms']} ms per "
        "image of a step (sleep).  ",
        f"Command: `{r['command']}`", "",
        f"CPU vs N=1: the median of {c['repeats']} interleaved rounds' ratios to their own N = 1 (min-max); "
        "CPU s/epoch: each N's median over the rounds. After the first epoch: the same with each job's CPU of "
        "its epochs after its first (a job's start, its attach and the first touch of its batch buffers, left "
        "out; the daemon's whole run kept).", "",
        "| N | batch sizes | CPU s/epoch (daemon + jobs) | CPU vs N=1 | CPU vs N=1 after the first epoch "
        "| storage MiB/epoch | storage vs N=1 | decodes/epoch | images/s per job vs alone (min-max) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in r["runs"]:
        vs = [j["vs_alone"] for j in run["jobs"]]
        med = run["median"]
        lines.append(f"| {run['n']} | {','.join(map(str, run['batch_sizes']))} | {med['cpu_s_per_epoch']:.2f} "
                     f"({med['daemon_cpu_s_per_epoch']:.2f} + {med['jobs_cpu_s_per_epoch']:.2f}) "
                     f"| **{run['cpu_ratio']:.2f}x** ({run['cpu_ratio_min']:.2f}-{run['cpu_ratio_max']:.2f}) "
                     f"| **{run['steady_cpu_ratio']:.2f}x** ({run['steady_cpu_ratio_min']:.2f}-"
                     f"{run['steady_cpu_ratio_max']:.2f}) "
                     f"| {run['storage_bytes_per_epoch'] / 2**20:.1f} "
                     f"| **{run['storage_ratio']:.2f}x** | {run['decodes_per_epoch']:.0f} "
                     f"| **{min(vs):.2f}x** ({min(vs):.2f}-{max(vs):.2f}) |")
    lines += ["", "Each job alone (the baseline of its images/s):", "",
              "| batch size | images/s | compute-bound (images/s x compute) | CPU s/epoch |", "|---:|---:|---:|---:|"]
    for b, run in r["alone"].items():
        ips = run["jobs"][0]["images_per_s"]
        frac = f"{ips / bound:.2f}" if bound else "-"
        lines.append(f"| {b} | {ips:.0f} | {frac} | {run['cpu_s_per_epoch']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
