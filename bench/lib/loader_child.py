"""One loader of the loader benchmark, in its own process (driven by bench/loaders.py).

The driver starts one child per loader and talks to it over stdin/stdout,
one JSON object per line:

    child -> driver  {"ready": ..., "pil": "<version>", ...}   once, after setup
    driver -> child  "epoch"                                    run one full epoch
    child -> driver  {"images": n, "seconds": s, "cpu_seconds": c, "main_cpu_seconds": m,
                      "cpu_between_epochs": b, "rss": {...}}     its result
    driver -> child  "quit"                                     exit cleanly

Each child builds its loader once (persistent workers, DALI pipeline), so
the driver can interleave epochs of all loaders round by round with one
warm-up epoch each, and every loader runs with the memory and worker start
it would have on its own. ``--pil-path`` puts a directory first on sys.path
before anything imports PIL: that is how plain Pillow runs beside the
pillow-simd installed in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loader", required=True,
                   choices=["coordl", "torch", "dali", "coordl-dali", "coordl-accelerate", "floor",
                            "floor-parallel"])
    p.add_argument("--root", required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="worker processes / DALI threads")
    p.add_argument("--pil-path", default=None, help="directory put first on sys.path (plain Pillow)")
    p.add_argument("--expect-pil", choices=["plain", "simd"], default=None)
    p.add_argument("--coordl-path", default=None,
                   help="directory put first on sys.path before coordl is imported (an earlier coordl, "
                        "bench/lib/before.py)")
    p.add_argument("--dali-variant", default="fused", choices=["fused", "tuned"])
    p.add_argument("--floor-cpu", type=int, default=None, help="pin the floor to this one CPU")
    return p.parse_args()


def _check_pil(expect: str | None) -> str:
    import PIL

    simd = ".post" in PIL.__version__
    if expect == "plain" and simd:
        sys.exit(f"expected plain Pillow, imported {PIL.__version__} from {PIL.__file__}")
    if expect == "simd" and not simd:
        sys.exit(f"expected pillow-simd, imported {PIL.__version__} from {PIL.__file__}")
    return PIL.__version__


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _private(pid: int) -> int:
    """RssAnon: resident private memory (no shared-memory batch buffers, no mapped files)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _memory() -> dict:
    """RSS (and private RSS) of this process and of each live child (the loader's workers)."""
    import psutil

    kids = [p.pid for p in psutil.Process().children() if p.is_running()]
    out = {"main": _rss(os.getpid()), "workers": [], "workers_private": []}
    for pid in kids:
        try:
            rss, private = _rss(pid), _private(pid)
        except OSError:
            continue
        out["workers"].append(rss)
        out["workers_private"].append(private)
    return out


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads) and its live children."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for kid in me.children():
        try:
            total += sum(kid.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def _torch_epoch(loader) -> int:
    n = 0
    for images, _labels in loader:
        n += images.shape[0]
    return n


def make_coordl(a):
    import coordl

    ds = coordl.ImageFolder(a.root, "train")
    loader = coordl.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                               persistent_workers=True)
    return lambda: _torch_epoch(loader), {"files": len(ds)}


def make_coordl_dali(a):
    import coordl

    ds = coordl.ImageFolder(a.root, "train")
    loader = coordl.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                               backend="dali")
    return lambda: _torch_epoch(loader), {"files": len(ds)}


def make_coordl_accelerate(a):
    from accelerate import Accelerator

    import coordl

    ds = coordl.ImageFolder(a.root, "train")
    loader = coordl.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                               persistent_workers=True)
    prepared = Accelerator(cpu=True).prepare(loader)
    return lambda: _torch_epoch(prepared), {"files": len(ds)}


def make_torch(a):
    import torch

    from coordl.cli.baseline import TorchvisionStyleFolder, worker_init_fn

    ds = TorchvisionStyleFolder(a.root)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True,
                                         num_workers=a.workers, persistent_workers=True,
                                         worker_init_fn=worker_init_fn)
    return lambda: _torch_epoch(loader), {"files": len(ds)}


def make_dali(a):
    from dali_pipe import build

    it, files = build(a.root, a.batch_size, a.workers, a.dali_variant)

    state = {"first": True}

    def epoch() -> int:
        # reset() starts DALI's prefetching of the next epoch; calling it here,
        # inside the timed epoch, keeps that work out of the other loaders' time.
        if not state["first"]:
            it.reset()
        state["first"] = False
        n = 0
        for out in it:
            n += out[0]["images"].shape[0]
        return n

    return epoch, {"files": files}


def make_floor(a):
    """Full decode of every file, one process on one core: the per-core decode floor."""
    from PIL import Image

    from coordl.manifest.build import scan

    if a.floor_cpu is not None:
        os.sched_setaffinity(0, {a.floor_cpu})
    m = scan(a.root)
    paths = [m.path(i) for i in range(len(m))]

    def epoch() -> int:
        for p in paths:
            with Image.open(p) as img:
                img.load()
        return len(paths)

    return epoch, {"files": len(paths), "cpu": a.floor_cpu}


def _decode_all(paths: list[str]) -> None:
    from PIL import Image

    for p in paths:
        with Image.open(p) as img:
            img.load()


def make_floor_parallel(a):
    """Full decode of every file by one process per core at once (cores share caches)."""
    from concurrent.futures import ProcessPoolExecutor

    from coordl.manifest.build import scan

    m = scan(a.root)
    paths = [m.path(i) for i in range(len(m))]
    cpus = sorted(os.sched_getaffinity(0))
    pools = [ProcessPoolExecutor(1, initializer=os.sched_setaffinity, initargs=(0, {c}))
             for c in cpus]

    def epoch() -> int:
        parts = [pool.submit(_decode_all, paths[k::len(pools)]) for k, pool in enumerate(pools)]
        for f in parts:
            f.result()
        return len(paths)

    return epoch, {"files": len(paths), "cpus": cpus}


def main() -> None:
    a = _args()
    if a.pil_path:
        sys.path.insert(0, os.path.abspath(a.pil_path))
    if a.coordl_path:
        sys.path.insert(0, os.path.abspath(a.coordl_path))
    pil = _check_pil(a.expect_pil)
    make = {"coordl": make_coordl, "torch": make_torch, "dali": make_dali,
            "coordl-dali": make_coordl_dali, "coordl-accelerate": make_coordl_accelerate, "floor": make_floor,
            "floor-parallel": make_floor_parallel}[a.loader]
    epoch, facts = make(a)
    if a.loader.startswith("coordl"):
        import coordl

        facts["coordl_from"] = "coordl-path" if a.coordl_path and os.path.abspath(coordl.__file__).startswith(
            os.path.abspath(a.coordl_path) + os.sep) else "repository"
    print(json.dumps({"ready": True, "pil": pil, **facts}), flush=True)
    idle_since = None
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        cpu0, main0 = _cpu_seconds(), sum(os.times()[:2])
        # CPU this loader burnt while the driver timed the others (DALI runs
        # ahead into the next epoch); the driver charges it to this loader.
        between = 0.0 if idle_since is None else cpu0 - idle_since
        t0 = time.perf_counter()
        n = epoch()
        dt = time.perf_counter() - t0
        idle_since, main1 = _cpu_seconds(), sum(os.times()[:2])
        print(json.dumps({"images": n, "seconds": dt, "cpu_seconds": idle_since - cpu0,
                          "main_cpu_seconds": main1 - main0,
                          "cpu_between_epochs": between, "rss": _memory()}), flush=True)


if __name__ == "__main__":
    main()
