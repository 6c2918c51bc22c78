#!/usr/bin/env python3
"""Partitioned caching on Redis vs a local MinIO cache per server vs no cache: 3 simulated servers.

Three "servers" run on this machine: three processes, each one rank of
``coordl.DataLoader(ds, rank=r, world_size=3, shuffle=True)`` over the same
dataset, in lockstep epochs (a barrier at each epoch's start, as the allreduce
of data-parallel training keeps servers in step). Each runs in its own blkio
cgroup whose ``blkio.throttle.read_bps_device`` caps its reads of the disk that
holds the dataset (``--throttle-mbps`` per server: each simulated server has a
disk of its own), and reads storage without leaving pages in the page cache
(``drop_page_cache=True`` on every side), so the page cache holds nothing
between epochs and the dataset behaves as one that does not fit in memory.

Sides, each with the same memory budget per server (``--budget-fraction`` of
the dataset's bytes, so that the three budgets together hold the dataset and
one does not):

- ``partitioned``: three ``redis-server`` processes (one per server, loopback
  TCP; no network shaping: the link is this machine's loopback) with
  ``maxmemory`` = the budget and ``noeviction``, ``coordl.PartitionedCache``;
- ``minio``: a local MinIO segment of the budget per server (three segments);
- ``none``: no cache.

Per epoch and server: bytes read from storage (coordl's counter, and the
``read_bytes`` of /proc/<pid>/io of the loader process and its workers as a
cross-check that the bytes really came from the disk), bytes received from
peers' cache nodes, and the epoch time. ``--local-reads`` instead measures how
a server reads its own node's items (one 64-item batch): Redis MGET over
loopback TCP, over a unix socket, and the local MinIO segment.

Needs root and the cgroup v1 blkio controller (it says so and stops when they
are missing). Run it under the bench lock:

    flock /tmp/coordl-bench.lock .venv/bin/python bench/partitioned.py \\
        --data $BENCH_DATA/partitioned --out bench/results/partitioned
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import tempfile
import time

from lib import cgroup, pagecache, report

SIDES = ("partitioned", "minio", "none")
WORLD = 3
MiB = 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- one server: a rank of the loader --------------------------------------------------

def _server(rank: int, args, side: str, urls: list[str], budget: int, procs_files: list[str],
            barrier, out) -> None:
    cgroup.join(procs_files)
    import psutil

    import coordl

    ds = coordl.ImageFolder(args.data, transform="train", size=args.size, seed=0)
    if side == "partitioned":
        cache = coordl.PartitionedCache(urls, rank)
    elif side == "minio":
        cache = coordl.MinIOCache(budget, name=f"bench-partitioned-{os.getpid()}-{rank}")
    else:
        cache = None
    loader = coordl.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                               persistent_workers=args.workers > 0, rank=rank, world_size=WORLD,
                               cache=cache, drop_page_cache=True)
    me = psutil.Process()

    def read_bytes() -> int:  # this node process and its loader's workers
        return pagecache.read_bytes([me.pid] + [c.pid for c in me.children(recursive=True)])

    try:
        for epoch in range(args.epochs):
            barrier.wait()
            before, io0 = loader.stats(), read_bytes()
            t0 = time.perf_counter()
            for _ in loader:
                pass
            dt = time.perf_counter() - t0
            after, io1 = loader.stats(), read_bytes()
            delta = {k: after[k] - before[k] for k in ("storage_bytes", "storage_reads", "remote_bytes",
                                                          "remote_hits", "local_hits", "cache_hits")}
            out.put((rank, epoch, {"time_s": dt, "disk_read_bytes": io1 - io0, **delta}))
    finally:
        del loader
        if isinstance(cache, coordl.MinIOCache):
            cache.drop()


def run_side(args, side: str, budget: int, files: list[str]) -> list[list[dict]]:
    """Per server, per epoch: the measurements of one side."""
    from coordl.cache.partitioned import redisnode

    pagecache.evict(files)
    throttle = (cgroup.disk_of(args.data), int(args.throttle_mbps * MiB)) if args.throttle_mbps else None
    nodes, urls = [], []
    tmp = tempfile.mkdtemp(prefix="coordl-bench-redis-")
    try:
        if side == "partitioned":
            for _ in range(WORLD):
                cfg = redisnode.NodeConfig(port=_free_port(), memory=budget)
                proc = redisnode.launch(cfg, tmp)
                redisnode.wait_ready(cfg.url, proc)
                nodes.append(proc)
                urls.append(cfg.url)
        cgs = [cgroup.Cgroup(f"coordl-bench-part-{os.getpid()}-{r}", blkio=throttle is not None,
                             read_bps=throttle) for r in range(WORLD)]
        for cg in cgs:
            cg.__enter__()
        try:
            ctx = mp.get_context("fork")
            barrier, out = ctx.Barrier(WORLD), ctx.Queue()
            procs = [ctx.Process(target=_server, args=(r, args, side, urls, budget, cgs[r].procs_files,
                                                       barrier, out)) for r in range(WORLD)]
            for p in procs:
                p.start()
            rows = [[None] * args.epochs for _ in range(WORLD)]
            for _ in range(WORLD * args.epochs):
                rank, epoch, m = out.get(timeout=1800)
                rows[rank][epoch] = m
            for p in procs:
                p.join()
                if p.exitcode:
                    raise SystemExit(f"bench: server process of side {side} exited with {p.exitcode}")
        finally:
            for cg in cgs:
                cg.__exit__()
    finally:
        for proc in nodes:
            proc.terminate()
            proc.wait()
            proc.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)  # the nodes' folder (their --dir)
    return rows


# -- how a server reads its own node ---------------------------------------------------

def local_reads(args) -> dict:
    """ms per 64-item batch: Redis MGET over loopback TCP and a unix socket, MinIO get (+ copy)."""
    import subprocess

    import redis

    import coordl

    ds = coordl.ImageFolder(args.data, transform="val")
    items = list(range(min(len(ds), 640)))
    raws = [open(ds.manifest.path(i), "rb").read() for i in items]
    tmp = tempfile.mkdtemp(prefix="coordl-bench-redis-")
    if len(os.fsencode(os.path.join(tmp, "redis.sock"))) > 100:  # sun_path holds 107 bytes: a long $TMPDIR
        os.rmdir(tmp)  # would make redis-server exit at start
        tmp = tempfile.mkdtemp(prefix="coordl-bench-redis-", dir="/tmp")
    proc, minio = None, None
    try:
        sock, port = os.path.join(tmp, "redis.sock"), _free_port()
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", sock,
                                 "--save", "", "--appendonly", "no", "--maxmemory", str(4 * sum(map(len, raws))),
                                 "--maxmemory-policy", "noeviction", "--dir", tmp, "--loglevel", "warning"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # its log: a few lines at start
        minio = coordl.MinIOCache(2 * sum(map(len, raws)), name=f"bench-local-{os.getpid()}")
        from coordl.cache.partitioned import redisnode
        redisnode.wait_ready(f"redis://127.0.0.1:{port}/0", proc)
        tcp = coordl.PartitionedCache([f"redis://127.0.0.1:{port}/0"], 0).open(ds.fingerprint, len(ds))
        uds = coordl.PartitionedCache([f"unix://{sock}"], 0,  # the same node by another name: its own list
                                      membership="update").open(ds.fingerprint, len(ds))
        minio.open(ds.fingerprint, len(ds))
        for i, raw in zip(items, raws):
            tcp.put(i, raw)
            minio.put(i, raw)
        batches = [items[k:k + 64] for k in range(0, len(items), 64)]
        plain = redis.Redis(port=port)

        def timed(fn) -> float:
            times = []
            for _ in range(args.local_repeats):
                for b in batches:
                    t0 = time.perf_counter()
                    fn(b)
                    times.append(time.perf_counter() - t0)
            return 1e3 * statistics.median(times)

        res = {"batch_items": 64, "mean_item_bytes": sum(map(len, raws)) / len(raws),
               "redis_tcp_loopback_ms": timed(lambda b: tcp.get_many(b)),
               "redis_unix_socket_ms": timed(lambda b: uds.get_many(b)),
               "minio_view_ms": timed(lambda b: [minio.get(i) for i in b]),
               "minio_copy_ms": timed(lambda b: [bytes(minio.get(i)) for i in b]),
               "plain_mget_no_checks_tcp_ms": timed(lambda b: plain.mget([tcp.key(i) for i in b]))}
        plain.close()
        tcp.close()
        uds.close()
        return res
    finally:
        if minio is not None:
            minio.drop()
        if proc is not None:
            proc.terminate()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)  # the node's --dir and its unix socket


# -- the table -------------------------------------------------------------------------

def markdown(args, budget: int, total: int, sides: dict) -> str:
    lines = [f"3 simulated servers, dataset {total / MiB:.1f} MiB, budget {budget / MiB:.1f} MiB per server "
             f"({args.budget_fraction:.2f} of the dataset), storage {args.throttle_mbps} MiB/s per server, "
             f"batch {args.batch_size}, {args.workers} worker(s) per server, train transform {args.size}px.",
             "", "| side | epoch | storage MiB per server (0/1/2) | remote MiB per server | epoch s (slowest) |",
             "|---|---|---|---|---|"]
    for side, rows in sides.items():
        for e in range(args.epochs):
            st = "/".join(f"{rows[r][e]['storage_bytes'] / MiB:.1f}" for r in range(WORLD))
            rm = "/".join(f"{rows[r][e]['remote_bytes'] / MiB:.1f}" for r in range(WORLD))
            t = max(rows[r][e]["time_s"] for r in range(WORLD))
            lines.append(f"| {side} | {e + 1} | {st} | {rm} | {t:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--out", default=None)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--budget-fraction", type=float, default=0.5, help="per-server budget / dataset bytes")
    p.add_argument("--throttle-mbps", type=float, default=8.0, help="storage MiB/s per server (0: off)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--local-reads", action="store_true", help="only measure reads of a server's own node")
    p.add_argument("--local-repeats", type=int, default=20)
    args = p.parse_args()
    import coordl

    ds = coordl.ImageFolder(args.data, transform="val")
    total = ds.manifest.total_bytes
    facts = {"command": report.command(), "dataset": report.dataset(args.data), "versions": report.versions(),
             "machine": report.machine(sorted(os.sched_getaffinity(0)))}
    if args.local_reads:
        res = local_reads(args)
        md = "| read of 64 local items | ms |\n|---|---|\n" + "".join(
            f"| {k[:-3]} | {v:.2f} |\n" for k, v in res.items() if k.endswith("_ms"))
        report.write(args.out, {**facts, "local_reads": res}, md)
        return
    if args.throttle_mbps:
        why = cgroup.why_not("blkio", "blkio.throttle.read_bps_device")
        if why:
            raise SystemExit(f"bench: cannot throttle storage: {why} (or pass --throttle-mbps 0)")
    budget = int(args.budget_fraction * total)
    files = [ds.manifest.path(i) for i in range(len(ds))]
    sides = {s: run_side(args, s, budget, files) for s in args.sides.split(",")}
    result = {**facts, "budget_bytes": budget, "dataset_bytes": total, "throttle_mibps": args.throttle_mbps,
              "epochs": args.epochs, "sides": sides}
    report.write(args.out, result, markdown(args, budget, total, sides))


if __name__ == "__main__":
    main()
