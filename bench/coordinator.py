#!/usr/bin/env python3
"""Coordinated prep vs independent loaders: k training jobs on the same cores.

k = 1, 2, 4 jobs, each its own process, each consuming every batch of every
epoch of the same dataset (train transform: RandomResizedCrop(224) + flip to
uint8, batch 64, shuffled), in three ways:

- coord:   one `coordl serve` daemon (W prep workers) feeds all k jobs through
           the shared-memory ring; each job is `coordl.DataLoader(...,
           coordinator=...)`.
- torch:   k independent `torch.utils.data.DataLoader(num_workers=W,
           persistent_workers=True)` over a torchvision-style Dataset
           (coordl.cli.baseline.TorchvisionStyleFolder: Pillow open, convert,
           crop, resize, flip, to tensor), as a user writes it.
- coordl:  k independent `coordl.DataLoader(num_workers=W, persistent_workers=True)`.

"Consuming" a batch is receiving it and reading its labels and one pixel per
image (no copy); the compute variant also sleeps a fixed time per step (a GPU
step that leaves the CPUs free). Every job runs one warm-up epoch, waits at a
barrier until all k jobs are warm, then runs the measured epochs; aggregate
images/s = all images the k jobs consumed / (last job's end - first job's start).

Only batches prepared inside the timed window count. The independent loaders
prepare nothing while they wait at the barrier (their workers start an epoch
at iter()), but the daemon goes on filling its ring with the first batches of
the measured epochs: at k=1 on 600 images that was 8 of 20 batches, and
coord/coordl read 2.03x where it is ~1x. So a coord job, before the barrier,
waits until the daemon is idle (every job past its warm-up, nothing filling,
the ring full or the epochs all prepared), counts the batches already
prepared (`untimed_batches`, the same for every job), receives them at the
start untimed, and starts its clock after them: what it times was prepared
inside the window (the daemon starts refilling the freed slots while they are
received: a few ms of prep before the clock, against a window of seconds).
Rounds interleave the three ways (coord, torch, coordl, coord, ...); the table
shows medians over rounds and the median of per-round ratios.

Per-batch delivery overhead: one job whose steps are slow enough that the next
batch is always ready before it is asked for; the time of ``next(iterator)``
for a 64x3x224x224 uint8 batch, for each way of loading. And the
coordinator's transport alone: a ring that holds the whole epoch, prepared
before the job times ``next()`` back to back, with nothing else running.

A tiny run: a small dataset, `--ks 1 --computes 0 --epochs 1 --rounds 1 --samples 2
--transport-rounds 1 --delivery-modes coord-pin,coordl --transport-modes coord`.
Run it under the bench lock (other benchmarks take it too):

    flock /tmp/coordl-bench.lock .venv/bin/python bench/coordinator.py \\
        --data /work/bench-data/coord --out bench/results/coordinator
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from lib import report

MODES = ("coord", "torch", "coordl")
# delivery: seconds each step pauses, long enough for the ring (coord) or torch's prefetch queue to fill
DELIVERY_PAUSE = {"coord": 0.5, "coord-pin": 0.5, "torch": 0.8, "coordl": 0.8}
COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")


# -- the job process ---------------------------------------------------------------
def _make_loader(a):
    import torch

    import coordl

    if a.mode == "coord":
        ds = coordl.ImageFolder(a.data, transform="train")
        return coordl.DataLoader(ds, batch_size=a.batch_size, shuffle=True, pin_memory=a.pin,
                                 coordinator="unix://" + a.socket)
    if a.mode == "coordl":
        ds = coordl.ImageFolder(a.data, transform="train")
        return coordl.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                                 persistent_workers=True)
    from coordl.cli.baseline import TorchvisionStyleFolder, worker_init_fn

    return torch.utils.data.DataLoader(TorchvisionStyleFolder(a.data), batch_size=a.batch_size,
                                       shuffle=True, num_workers=a.workers, persistent_workers=True,
                                       worker_init_fn=worker_init_fn)


def _consume(images, labels) -> int:
    return int(labels.sum()) + int(images[:, 0, 0, 0].sum())


def job_main(a) -> None:
    import warnings

    warnings.simplefilter("ignore", UserWarning)  # pin_memory without an accelerator
    loader = _make_loader(a)
    for _ in range(a.warmup):
        for images, labels in loader:
            _consume(images, labels)
    untimed = 0
    if a.mode == "coord" and not a.delivery:
        untimed = prepared_before_the_window(loader.coordinator.status, a.warmup, a.epochs)
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every job is warm
    if a.delivery:
        print("result " + json.dumps(_delivery(loader, a)), flush=True)
        return
    images_seen, steps, t0 = 0, 0, None
    if untimed == 0:
        t0 = time.monotonic()
    for _ in range(a.epochs):
        for images, labels in loader:
            _consume(images, labels)
            steps += 1
            if t0 is None:  # a batch the daemon prepared before the window: received, not timed
                if steps == untimed:
                    t0 = time.monotonic()
                continue
            images_seen += images.shape[0]
            if a.compute:
                time.sleep(a.compute)
    t1 = time.monotonic()
    print("result " + json.dumps({"images": images_seen, "start": t0 if t0 is not None else t1,
                                  "end": t1, "untimed_batches": untimed}), flush=True)


def prepared_before_the_window(status, warmup: int, epochs: int, timeout: float = 600.0) -> int:
    """Batches of the measured epochs the daemon has prepared while its jobs wait at the barrier.

    Waits until the daemon is idle: every job past its warm-up (no warm-up batch in the ring),
    nothing filling, and the ring full or every batch of the measured epochs prepared. `status`
    is the daemon's (`Client.status`); the count is then the same for every job."""
    deadline = time.monotonic() + timeout
    while True:
        st = status()
        occ, bpe = st["occupancy"], st["batches_per_epoch"]
        ahead = st["produced_batches"] - warmup * bpe  # measured-epoch batches prepared
        if (occ["filling"] == 0 and occ["ready"] == ahead
                and (occ["free"] == 0 or ahead == epochs * bpe)):
            if ahead >= epochs * bpe:
                raise SystemExit(f"the ring ({st['slots']} slots) held all {epochs * bpe} batches of "
                                 "the measured epochs before the window: nothing left to time; "
                                 "pass more --epochs or fewer --slots")
            return ahead
        if time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not settle before the barrier: {occ}, {ahead} ahead")
        time.sleep(0.05)


def _delivery(loader, a) -> dict:
    """Seconds of next() for a batch that was ready before it was asked for.

    Each step pauses `compute` seconds (long enough for the ring, or torch's
    prefetch queue of 2 x workers batches, to be full), then times one
    next(). An epoch's first batch (it also starts the epoch) and its short
    last batch are not counted.
    """
    if a.transport:
        return _transport(loader, a)
    times = []
    while len(times) < a.samples:
        it = iter(loader)
        next(it)
        for images, labels in _timed(it, a.compute, a.batch_size, times):
            _consume(images, labels)
            if len(times) >= a.samples:
                break
        for _ in it:
            pass
    return {"times": times, "shape": list(images.shape), "dtype": str(images.dtype)}


def _timed(it, pause: float, batch_size: int, times: list[float]):
    while True:
        time.sleep(pause)
        t = time.perf_counter()
        try:
            images, labels = next(it)
        except StopIteration:
            return
        dt = time.perf_counter() - t
        if images.shape[0] == batch_size:  # a short last batch is not counted
            times.append(dt)
        yield images, labels


def _transport(loader, a) -> dict:
    """Seconds of next() when the whole epoch is already in the ring and nothing else runs."""
    it = iter(loader)
    deadline = time.monotonic() + 120
    while loader.coordinator.status()["occupancy"]["ready"] < len(loader):
        if time.monotonic() > deadline:
            raise SystemExit("the daemon did not prepare the epoch within 120 s")
        time.sleep(0.1)
    time.sleep(0.5)
    warm = []
    for step in range(len(loader)):
        t = time.perf_counter()
        images, labels = next(it)
        dt = time.perf_counter() - t
        if step > 0 and images.shape[0] == a.batch_size:
            warm.append(dt)
        _consume(images, labels)
    return {"times": warm, "shape": list(images.shape), "dtype": str(images.dtype)}


# -- one measured run ------------------------------------------------------------
def _start_daemon(a, k: int, epochs: int, sockdir: str, slots: int) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(sockdir, "bench.sock")
    argv = [COORDL, "serve", "--data", a.data, "--batch-size", str(a.batch_size), "--workers",
            str(a.workers), "--slots", str(slots), "--socket", sock, "--epochs", str(epochs),
            "--min-jobs", str(k), "--join-window", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "listening" not in line:
        proc.kill()
        raise SystemExit(f"coordl serve did not start: {line!r}")
    return proc, sock


def run(a, mode: str, k: int, compute: float, delivery: bool = False, transport: bool = False) -> dict:
    """Start k jobs (and a daemon for coord), pass the barrier, collect their results."""
    with tempfile.TemporaryDirectory(prefix="cb-", dir="/tmp") as sockdir:
        daemon, sock = None, ""
        epochs = a.warmup + (1000 if delivery else a.epochs)
        if mode.startswith("coord") and mode != "coordl":
            slots = a.slots
            if transport:  # the whole epoch fits the ring: nothing is prepared while it is timed
                slots = -(-report.dataset(a.data)["files"] // a.batch_size)
                epochs = a.warmup + 1
            daemon, sock = _start_daemon(a, k, epochs, sockdir, slots)
        job_argv = [sys.executable, os.path.abspath(__file__), "--job", "--mode",
                    "coord" if mode.startswith("coord") and mode != "coordl" else mode,
                    "--data", a.data, "--batch-size", str(a.batch_size), "--workers", str(a.workers),
                    "--socket", sock, "--epochs", str(a.epochs), "--warmup", str(a.warmup),
                    "--compute", str(compute), "--samples", str(a.samples)]
        if delivery:
            job_argv.append("--delivery")
        if transport:
            job_argv.append("--transport")
        if mode == "coord-pin":
            job_argv.append("--pin")
        jobs = [subprocess.Popen(job_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for _ in range(k)]
        try:
            for job in jobs:
                _expect(job, "ready", 600)
            for job in jobs:
                job.stdin.write("go\n")
                job.stdin.flush()
            results = [json.loads(_expect(job, "result ", 1800)[len("result "):]) for job in jobs]
            for job in jobs:
                job.wait(60)
        finally:
            for job in jobs:
                if job.poll() is None:
                    job.kill()
                    job.wait()
            if daemon is not None:
                if daemon.poll() is None:
                    daemon.send_signal(signal.SIGTERM)
                daemon.wait(60)
    if delivery:
        return results[0]
    images = sum(r["images"] for r in results)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {"images": images, "seconds": span, "images_per_s": images / span,
            "per_job_images_per_s": [r["images"] / (r["end"] - r["start"]) for r in results],
            "untimed_batches": [r["untimed_batches"] for r in results]}


def _expect(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line.strip()
    raise SystemExit(f"a job never printed {prefix!r} (exit {proc.poll()})")


# -- the whole benchmark -----------------------------------------------------------
def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--computes", default="0,0.05", help="seconds of compute per step")
    ap.add_argument("--epochs", type=int, default=2, help="measured epochs per job")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up epochs per job")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="daemon prep workers = workers per loader")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--samples", type=int, default=40, help="delivery: next() calls timed")
    ap.add_argument("--transport-rounds", type=int, default=3, help="transport: epochs timed per mode")
    ap.add_argument("--delivery-modes", default=",".join(DELIVERY_PAUSE), help="delivery: which loaders")
    ap.add_argument("--transport-modes", default="coord,coord-pin", help="transport: which coordinator modes")
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--socket", default="", help=argparse.SUPPRESS)
    ap.add_argument("--compute", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--delivery", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--transport", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        job_main(a)
        return
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus)  # every child inherits the same CPU set
    ks = [int(k) for k in a.ks.split(",")]
    computes = [float(c) for c in a.computes.split(",")]
    runs = []
    for rnd in range(a.rounds):
        for compute in computes:
            for k in ks:
                order = MODES if rnd % 2 == 0 else MODES[::-1]
                for mode in order:
                    load = os.getloadavg()[0]
                    r = run(a, mode, k, compute)
                    runs.append({"round": rnd, "compute_s": compute, "k": k, "mode": mode,
                                 "loadavg_1min_before": load, **r})
                    print(f"round {rnd} compute {compute * 1e3:.0f} ms k={k} {mode:>6}: "
                          f"{r['images_per_s']:7.0f} images/s aggregate", flush=True)
    delivery = {}
    for mode in a.delivery_modes.split(","):
        pause = DELIVERY_PAUSE[mode]
        times = run(a, mode, 1, pause, delivery=True)
        delivery[mode] = {"shape": times["shape"], "pause_s": pause, **_percentiles(times["times"])}
        print(f"delivery {mode:>9}: {delivery[mode]['median_us']:.0f} us", flush=True)
    transport = {}
    for mode in a.transport_modes.split(","):
        times = [t for _ in range(a.transport_rounds)
                 for t in run(a, mode, 1, 0.0, delivery=True, transport=True)["times"]]
        transport[mode] = _percentiles(times)
        print(f"transport {mode:>9}: {transport[mode]['median_us']:.0f} us", flush=True)
    result = {
        "machine": report.machine(cpus), "dataset": report.dataset(a.data), "versions": report.versions(),
        "command": report.command(),
        "config": {k: getattr(a, k) for k in ("batch_size", "workers", "slots", "epochs", "warmup", "rounds")},
        "runs": runs, "summary": _summarize(runs, ks, computes), "delivery": delivery,
        "transport": transport,
    }
    report.write(a.out, result, markdown(result))


def _percentiles(seconds: list[float]) -> dict:
    us = sorted(t * 1e6 for t in seconds)
    return {"median_us": statistics.median(us), "p10_us": us[len(us) // 10],
            "p90_us": us[(9 * len(us)) // 10], "samples": len(us)}


def _summarize(runs: list[dict], ks: list[int], computes: list[float]) -> dict:
    out: dict = {}
    if not runs:
        return out
    for compute in computes:
        for k in ks:
            cell = {m: _summary([r["images_per_s"] for r in runs
                                 if (r["compute_s"], r["k"], r["mode"]) == (compute, k, m)]) for m in MODES}
            for base in ("torch", "coordl"):
                ratios = []
                for rnd in sorted({r["round"] for r in runs}):
                    pick = {r["mode"]: r["images_per_s"] for r in runs
                            if (r["round"], r["compute_s"], r["k"]) == (rnd, compute, k)}
                    ratios.append(pick["coord"] / pick[base])
                cell[f"coord/{base}"] = _summary(ratios)
            out[f"{compute}/{k}"] = cell
    return out


def markdown(r: dict) -> str:
    m, d, c = r["machine"], r["dataset"], r["config"]
    lines = [
        f"Machine: {m['cpu_model']}, {m['cores_used']} cores used (ids {m['cpu_ids']}), kernel {m['kernel']}.  ",
        f"Dataset: {d['root']}, {d['files']} JPEGs, mean {d['mean_bytes'] / 1024:.1f} KiB.  ",
        f"Train transform to uint8 224x224, batch {c['batch_size']}; {c['workers']} prep workers in the "
        f"daemon = {c['workers']} workers per independent loader; ring of {c['slots']} slots; "
        f"{c['warmup']} warm-up + {c['epochs']} measured epochs per job; {c['rounds']} interleaved rounds.  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".  ",
        f"Command: `{r['command']}`",
        "",
        "Aggregate images/s of k jobs (median over rounds, min-max); coord/x = median of per-round ratios. "
        "Only batches prepared inside the timed window count: a coord job receives the batches the daemon "
        "prepared while the jobs waited at the barrier untimed, then starts its clock (`untimed_batches` "
        "in the JSON); the independent loaders prepare nothing before their epoch starts.",
        "",
        "| compute/step | k | coord | torch | coordl | coord / torch | coord / coordl |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, cell in r["summary"].items():
        compute, k = key.split("/")
        fmt = lambda s: f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"  # noqa: E731
        rat = lambda s: f"**{s['median']:.2f}x** ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
        lines.append(f"| {float(compute) * 1e3:.0f} ms | {k} | {fmt(cell['coord'])} | {fmt(cell['torch'])} "
                     f"| {fmt(cell['coordl'])} | {rat(cell['coord/torch'])} | {rat(cell['coord/coordl'])} |")
    lines += ["", "Per-batch delivery overhead: wall time of `next(iterator)` for a 64x3x224x224 uint8 batch "
              "that was prepared before it was asked for (median, p10-p90, µs). Each step pauses (0.5 s "
              "coordinator, 0.8 s torch/coordl: the ring, or the prefetch queue of 2 x 2 batches, is full), "
              "then takes one batch; the prep of later batches runs on the same 2 cores meanwhile.",
              "", "| loader | µs per batch | samples |", "|---|---:|---:|"]
    names = {"coord": "coordinator, zero-copy view of the slot",
             "coord-pin": "coordinator, pin_memory=True (one copy out of the slot; no GPU here)",
             "torch": "torch DataLoader, 2 workers (shared-memory tensor, unpickled)",
             "coordl": "coordl DataLoader, 2 workers (shared-memory batch)"}
    cell = lambda s: f"{s['median_us']:.0f} ({s['p10_us']:.0f}-{s['p90_us']:.0f})"  # noqa: E731
    for mode, dl in r["delivery"].items():
        lines.append(f"| {names[mode]} | {cell(dl)} | {dl['samples']} |")
    lines += ["", "The coordinator's transport alone: the whole epoch already prepared in the ring, "
              "nothing else running, `next(iterator)` back to back (median, p10-p90, µs):", "",
              "| loader | µs per batch | samples |", "|---|---:|---:|"]
    for mode, t in r["transport"].items():
        lines.append(f"| {names[mode]} | {cell(t)} | {t['samples']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
