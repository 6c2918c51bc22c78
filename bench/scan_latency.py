"""The dataset scan on storage whose metadata costs a round trip: do the scan's threads help?

    .venv/bin/python bench/scan_latency.py --files 10000 --delay-ms 1 --out bench/results/scan-latency

A network filesystem (NFS, Lustre, a FUSE bucket mount) answers each `stat` or
directory read with a round trip, where a local disk with a warm cache answers
from memory. No such filesystem is reachable from these machines, so this bench
makes one: a read-only FUSE passthrough (fusepy, multithreaded) over a local
tree that waits --delay-ms before each getattr, readdir, open and read, as a
server a round trip away would. The kernel caches its answers for --cache-s
seconds (FUSE's entry_timeout/attr_timeout; NFS's attribute cache is 3-60 s),
and every measurement starts after that long, so each one starts cold.

Then, each in a fresh process, interleaved over --rounds rounds (medians):

- the plain Python loop, scandir + one `stat` per file (the stat loop of bench/scale.py),
- coordl's walk (coordl/manifest/walk.py) on 1 thread and with its thread pool,
- coordl's first start (walk + content sample + fingerprint + write), 1 thread / pool,
- coordl's restart on the unchanged tree (folder and sample checks), 1 thread / pool.

Needs libfuse2 and fusepy (``apt-get install libfuse2 fuse; .venv/bin/pip install fusepy``:
not in install.sh, this bench is not in CI) and root or /dev/fuse access. The mount
is unmounted and its server stopped however the bench ends.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402
from lib import report  # noqa: E402

# -- the filesystem: a passthrough that waits before answering ---------------------------


def serve(source: str, mountpoint: str, delay_s: float, cache_s: float) -> None:
    """Run the FUSE server in the foreground until unmounted (this process's whole job)."""
    import fuse

    class Slow(fuse.Operations):
        def __init__(self) -> None:
            self.calls = 0
            self._lock = threading.Lock()

        def _wait(self, path: str) -> str:
            with self._lock:
                self.calls += 1
            time.sleep(delay_s)
            return os.path.join(source, path.lstrip("/"))

        def getattr(self, path, fh=None):
            try:
                st = os.lstat(self._wait(path))
            except OSError as e:
                raise fuse.FuseOSError(e.errno) from e
            return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid",
                                                "st_atime", "st_mtime", "st_ctime", "st_ino")}

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._wait(path))]

        def readlink(self, path):
            return os.readlink(self._wait(path))

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise fuse.FuseOSError(errno.EROFS)
            return os.open(self._wait(path), os.O_RDONLY)

        def read(self, path, size, offset, fh):
            self._wait(path)
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)

    fuse.FUSE(Slow(), mountpoint, foreground=True, nothreads=False, ro=True,
              entry_timeout=cache_s, attr_timeout=cache_s, negative_timeout=cache_s)


class Mount:
    """The FUSE server in a child process, mounted at a fresh folder; unmounted on exit."""

    def __init__(self, source: str, delay_s: float, cache_s: float) -> None:
        self.path = tempfile.mkdtemp(prefix="coordl-slowfs-")
        self._proc = subprocess.Popen([sys.executable, __file__, "--serve", source, self.path,
                                       "--delay-ms", str(delay_s * 1000), "--cache-s", str(cache_s)])
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"bench: the FUSE server did not mount {self.path} (exit {self._proc.poll()}): "
                                 "needs libfuse2 and fusepy (see this file's docstring) and /dev/fuse")
            time.sleep(0.05)

    def close(self) -> None:
        if os.path.ismount(self.path):
            subprocess.run(["fusermount", "-u", self.path], check=False)
            if os.path.ismount(self.path):
                subprocess.run(["umount", "-l", self.path], check=False)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.rmdir(self.path)

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- one measurement per process ---------------------------------------------------------

def child(kind: str, root: str, store: str, threads: int) -> dict:
    from coordl.datasets.imagefolder import ImageFolder  # imported before the clock starts (it imports torch)
    from coordl.manifest import build as manifest
    from coordl.manifest import store as manifest_store
    from coordl.manifest import walk as manifest_scan
    manifest.SCAN_THREADS = threads
    manifest_store.STAT_THREADS = threads if threads == 1 else manifest_store.STAT_THREADS
    t = time.perf_counter()
    if kind == "stat":
        n = scale._stat_loop(root)
    elif kind == "walk":
        n = len(manifest_scan.walk(root, tuple(manifest.IMG_EXTENSIONS), None, threads).sizes)
    else:
        if kind == "first":
            shutil.rmtree(store, ignore_errors=True)
        n = len(ImageFolder(root, manifest_cache=store))
    return {"s": time.perf_counter() - t, "n": n, **manifest.SCANS}


ROWS = [  # (key, kind, threads, label)
    ("stat", "stat", 1, "plain Python loop: scandir + one `stat` per file"),
    ("walk_1t", "walk", 1, "coordl walk, 1 thread"),
    ("walk", "walk", 8, "coordl walk, thread pool (8, once blocked)"),
    ("first_1t", "first", 1, "coordl first start, 1 thread"),
    ("first", "first", 8, "coordl first start, thread pools (default)"),
    ("restart_1t", "restart", 1, "coordl restart, tree unchanged, 1 thread"),
    ("restart", "restart", 8, "coordl restart, tree unchanged, 32 check threads (default)"),
]


def measure(kind: str, root: str, store: str, threads: int, cache_s: float) -> dict:
    time.sleep(cache_s + 0.5)  # every answer the kernel cached has expired: a cold start
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--root", root, "--store", store,
                          "--threads", str(threads)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--classes", type=int, default=50)
    ap.add_argument("--delay-ms", type=float, default=1.0, help="wait before each metadata or read answer")
    ap.add_argument("--cache-s", type=float, default=1.0, help="how long the kernel keeps an answer")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--source", default=None, help="the local tree (default /tmp/coordl-scale-FILES)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--serve", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=8, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve[0], a.serve[1], a.delay_ms / 1000, a.cache_s)
        return
    if a.child:
        print(json.dumps(child(a.child, a.root, a.store, a.threads)))
        return
    source = a.source or f"/tmp/coordl-scale-{a.files}"
    tree = scale.build(source, a.files, a.classes)
    store = tempfile.mkdtemp(prefix="coordl-slowfs-manifests-")
    runs: dict = {key: [] for key, *_ in ROWS}
    try:
        with Mount(source, a.delay_ms / 1000, a.cache_s) as mnt:
            measure("first", mnt.path, store, 8, a.cache_s)  # so that the restart rows find a manifest
            for k in range(a.rounds):
                for key, kind, threads, label in ROWS:
                    r = measure(kind, mnt.path, store, threads, a.cache_s)
                    assert r["n"] == a.files, f"{label} found {r['n']} files, not {a.files}"
                    runs[key].append(r["s"])
                    print(f"round {k + 1}/{a.rounds} {label}: {r['s']:.2f} s", flush=True)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    stat = runs["stat"]
    rows = {key: {"label": label, "runs_s": runs[key], "s": float(np.median(runs[key])),
                  "ratio": float(np.median([x / b for x, b in zip(runs[key], stat)]))}
            for key, _kind, _threads, label in ROWS}
    res = {"files": a.files, "classes": a.classes, "tree": tree, "delay_ms": a.delay_ms, "cache_s": a.cache_s,
           "rounds": a.rounds, "rows": rows, "machine": report.machine(list(range(os.cpu_count() or 1))),
           "command": report.command()}
    report.write(a.out, res, markdown(res))


def markdown(r: dict) -> str:
    lines = [f"### The scan on slow metadata: {r['files']:,} files in {r['classes']:,} folders over FUSE, "
             f"{r['delay_ms']:g} ms per answer (`bench/scan_latency.py`)", "",
             f"A read-only FUSE passthrough that waits {r['delay_ms']:g} ms before each getattr, readdir, open "
             f"and read (a server one round trip away); the kernel keeps answers {r['cache_s']:g} s and each "
             f"figure starts after that, in a fresh process. {r['rounds']} interleaved rounds, medians; the "
             "ratio is the median of the per-round ratios to the stat loop.", "",
             f"    {r['command']}", "",
             "| on storage one round trip away | time | / stat loop |", "|---|---:|---:|"]
    for v in r["rows"].values():
        lines.append(f"| {v['label']} | {v['s']:.2f} s | {v['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
