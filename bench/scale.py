"""ImageNet scale: how long a 1.28M-file dataset takes to start, and what else grows with it.

    .venv/bin/python bench/scale.py --files 1281000 --out bench/results/scale     # not in CI

Builds (once; kept unless --rebuild) a tree of --files tiny JPEGs in --classes
folders: one ~3 KiB JPEG whose bytes are *copied* into every file (each file
its own inode and data block, as a real dataset has; hard links would share
one inode and make every cold `stat` hit the same cached inode). Then, each
in a fresh process, warm (the best of two runs) and, only with
--drop-page-cache, cold, in --rounds interleaved rounds (every row once per
round; medians and per-round ratios to the stat loop).

Cold figures need --drop-page-cache, as root: before each cold process the
bench runs ``sync; echo 3 > /proc/sys/vm/drop_caches``, which empties the page
cache, dentries and inodes of the WHOLE MACHINE (every other program's cached
files too, not just this tree's). Without the flag it never writes there and
reports warm figures only. The figures measured:

- a torchvision-style scan (its make_dataset: os.walk + sorted names, no stat),
- a plain Python loop: scandir + one stat per file,
- coordl's first start (no persisted manifest: walk + content sample +
  fingerprint + write), with the scan's thread pool and with one thread,
- coordl's rescan (``rescan=True``: the same, plus the silent-revision compare),
- coordl's restart on the unchanged tree (loads the persisted manifest),
- the fingerprint's content sample alone (manifest_identity.content_digest);

and then the figures that grow with the item count: DataLoader worker start
(iter to first batch) and per-worker USS/PSS over the first 100k items of an
epoch, beside torch's DataLoader over a list-of-(path, label)-tuples dataset;
the MinIO cache's index (create, attach, `coordl cache ls`); the epoch plan
(coordl.epochs.sampling.epoch_order, ms per epoch); partition placement over 4 nodes;
the coordinator daemon's start (`coordl serve --data ROOT` to its "listening"
line, the persisted manifest present) and `coordl status` against it (the
whole command), cold and warm.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
from multiprocessing import Pool

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import report  # noqa: E402

EXTS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# -- the tree --------------------------------------------------------------------------------

def _jpeg() -> bytes:
    from PIL import Image
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:84, 0:112]
    img = np.stack([x * 2, y * 3, (x + y)], -1) + rng.integers(0, 24, (84, 112, 3))
    buf = io.BytesIO()
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _write_class(args: tuple) -> None:
    root, c, count, data = args
    d = os.path.join(root, f"n{c:08d}")
    os.makedirs(d, exist_ok=True)
    for k in range(count):
        with open(os.path.join(d, f"n{c:08d}_{k:06d}.JPEG"), "wb") as f:
            f.write(data)


def build(root: str, files: int, classes: int) -> dict:
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        with open(marker) as f:
            info = json.load(f)
        if info["files"] == files and info["classes"] == classes:
            return info
        shutil.rmtree(root)
    data = _jpeg()
    t = time.perf_counter()
    per = [files // classes + (c < files % classes) for c in range(classes)]
    with Pool(2) as pool:
        pool.map(_write_class, [(root, c, per[c], data) for c in range(classes)], chunksize=4)
    info = {"files": files, "classes": classes, "jpeg_bytes": len(data), "how": "copied (one file per inode)",
            "build_s": round(time.perf_counter() - t, 1)}
    with open(marker, "w") as f:
        json.dump(info, f)
    return info


# -- one measurement per process ---------------------------------------------------------

def _torchvision_style(root: str) -> int:
    """torchvision.datasets.folder.make_dataset, written out (torchvision is not a dependency)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for idx, cls in enumerate(classes):
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if path.lower().endswith(EXTS):
                    samples.append((path, idx))
    return len(samples)


def _stat_loop(root: str) -> int:
    n = 0
    for cls in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for e in os.scandir(os.path.join(root, cls)):
            os.stat(e.path)
            n += 1
    return n


def child(kind: str, root: str, store: str, threads: int) -> dict:
    from coordl.manifest import build as manifest
    from coordl.manifest import identity as manifest_identity
    manifest.SCAN_THREADS = threads
    if kind in ("tv", "stat"):
        t = time.perf_counter()
        n = (_torchvision_style if kind == "tv" else _stat_loop)(root)
        return {"s": time.perf_counter() - t, "n": n}
    if kind == "sample":
        m = manifest.scan(root, manifest_cache=store)
        if os.environ.get("SCALE_COLD"):
            _drop_caches()
        pos = manifest_identity.sample_positions(len(m))
        t = time.perf_counter()
        manifest_identity.content_digest([m.path(i) for i in pos.tolist()], pos, threads)
        return {"s": time.perf_counter() - t, "n": len(pos)}
    from coordl.datasets.imagefolder import ImageFolder  # imported before the clock starts (it imports torch)
    if kind == "first":
        shutil.rmtree(store, ignore_errors=True)
    t = time.perf_counter()
    ds = ImageFolder(root, manifest_cache=store, rescan=kind == "rescan")
    return {"s": time.perf_counter() - t, "n": len(ds), "fingerprint": ds.fingerprint, **manifest.SCANS}


def _drop_caches() -> bool:
    """Empty the whole machine's page cache, dentries and inodes (root only). Called only under
    --drop-page-cache: `main` never measures cold otherwise."""
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def measure(kind: str, root: str, store: str, threads: int, cold: bool) -> dict:
    env = dict(os.environ)
    if cold and kind != "sample":
        _drop_caches()
    if cold and kind == "sample":
        env["SCALE_COLD"] = "1"
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--root", root, "--store", store,
                          "--threads", str(threads)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the coordinator daemon --------------------------------------------------------------

def serve_once(root: str, store: str, cold: bool, batch: int = 64, size: int = 224) -> dict:
    """`coordl serve --data ROOT` from exec to its "listening" line (it scans or loads the
    manifest, makes the ring, starts 2 prep workers), then `coordl status` against it (the
    whole command: interpreter, imports, one request), then SIGTERM."""
    import select
    import signal
    import tempfile
    cli = os.path.join(os.path.dirname(sys.executable), "coordl")
    env = {**os.environ, "COORDL_MANIFEST_CACHE": store}
    sockdir = tempfile.mkdtemp(prefix="cdl-scale-", dir="/tmp")  # AF_UNIX paths are short
    sock = os.path.join(sockdir, "s.sock")
    argv = [cli, "serve", "--data", root, "--batch-size", str(batch), "--size", str(size), "--socket", sock,
            "--workers", "2", "--join-window", "0"]
    if cold:
        _drop_caches()
    try:
        with open(os.path.join(sockdir, "serve.err"), "w") as err:
            t = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 600)
            line = proc.stdout.readline() if ready else ""
            start_s = time.perf_counter() - t
            if "listening" not in line:
                with open(os.path.join(sockdir, "serve.err")) as f:
                    raise RuntimeError(f"coordl serve did not start: {line!r}\n{f.read()[-2000:]}")
            if cold:
                _drop_caches()
            t = time.perf_counter()
            out = subprocess.run([cli, "status", "--socket", sock], check=True, capture_output=True, text=True)
            status_s = time.perf_counter() - t
            items = int(out.stdout.split(" items")[0].rsplit("(", 1)[1])
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            proc.stdout.close()
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)
    return {"start_s": start_s, "status_s": status_s, "items": items}


def serve_figures(root: str, store: str, can_drop: bool) -> dict:
    """Cold (caches dropped before `serve` and again before `status`) and warm (best of two)."""
    cold = serve_once(root, store, True) if can_drop else None
    warm = [serve_once(root, store, False) for _ in range(2)]
    return {"items": warm[0]["items"],
            "start_cold_s": cold and cold["start_s"], "status_cold_s": cold and cold["status_s"],
            "start_warm_s": min(w["start_s"] for w in warm), "status_warm_s": min(w["status_s"] for w in warm)}


# -- the figures that grow with the item count -------------------------------------------

class _TupleFolder:
    """What torchvision's ImageFolder keeps: a Python list of (path, label) tuples."""

    def __init__(self, root: str):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [(e.path, i) for i, c in enumerate(classes)
                        for e in sorted(os.scandir(os.path.join(root, c)), key=lambda e: e.name)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image
        path, label = self.samples[i]
        with Image.open(path) as img:
            arr = np.asarray(img.convert("RGB").resize((32, 32)))
        return torch.from_numpy(arr.copy()).permute(2, 0, 1), label


def _workers_memory() -> list[tuple[float, float]]:
    import psutil
    out = []
    for p in psutil.Process().children(recursive=True):
        with __import__("contextlib").suppress(psutil.Error):
            m = p.memory_full_info()
            out.append((m.uss / 2**20, m.pss / 2**20))
    return out


def loader_memory(root: str, store: str, which: str, items: int, workers: int = 2, batch: int = 250) -> dict:
    import torch

    import coordl
    if which == "coordl":
        ds = coordl.ImageFolder(root, transform="val", size=32, manifest_cache=store)
        loader = coordl.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers)
    else:
        ds = _TupleFolder(root)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers)
    t = time.perf_counter()
    it = iter(loader)
    next(it)
    start_s = time.perf_counter() - t
    first, seen, marks = _workers_memory(), batch, []
    for _ in it:
        seen += batch
        if seen % 20000 < batch:
            marks.append((seen, _workers_memory()))
        if seen >= items:
            break
    last = _workers_memory()
    del it

    def mean(ms, k):
        return round(sum(m[k] for m in ms) / max(1, len(ms)), 1)

    return {"start_s": round(start_s, 2), "items": seen, "uss_first": mean(first, 0), "uss_last": mean(last, 0),
            "pss_first": mean(first, 1), "pss_last": mean(last, 1),
            "uss_marks": [(s, mean(ms, 0)) for s, ms in marks]}


def index_figures(root: str, store: str) -> dict:
    from coordl.cache.partitioned import placement
    from coordl.datasets.caching import MinIOCache
    from coordl.epochs import sampling
    from coordl.manifest import build as manifest
    m = manifest.scan(root, manifest_cache=store)
    n, out = len(m), {}
    t = time.perf_counter()
    cache = MinIOCache("64MiB", name=f"scale-{os.getpid()}").open(m.fingerprint, n, label="bench/scale")
    cache.put(0, b"x")
    out["minio_create_s"] = time.perf_counter() - t
    out["minio_index_mib"] = 16 * n / 2**20
    try:
        t = time.perf_counter()
        other = MinIOCache("64MiB", name=f"scale-{os.getpid()}").open(m.fingerprint, n, label="bench/scale")
        assert bytes(other.get(0)) == b"x"
        out["minio_attach_s"] = time.perf_counter() - t
        coordl_cli = os.path.join(os.path.dirname(sys.executable), "coordl")
        t = time.perf_counter()
        subprocess.run([coordl_cli, "cache", "ls"], check=True, capture_output=True)
        out["cache_ls_s"] = time.perf_counter() - t
        other.close()
    finally:
        cache.drop()
    times = []
    for epoch in range(1, 6):
        t = time.perf_counter()
        sampling.epoch_order(n, 0, epoch)
        times.append(time.perf_counter() - t)
    out["epoch_order_ms"] = 1000 * min(times)
    salts = placement.node_salts(m.fingerprint, [f"node{k}:6379/0" for k in range(4)])
    t = time.perf_counter()
    placement.owners(salts, np.arange(n))
    out["placement_4_nodes_ms"] = 1000 * (time.perf_counter() - t)
    return out


# -- the run -----------------------------------------------------------------------------

ROWS = [  # (key, kind, threads, label)
    ("tv", "tv", 1, "torchvision-style scan (os.walk, names only)"),
    ("stat", "stat", 1, "plain Python loop: scandir + one `stat` per file"),
    ("first", "first", 8, "coordl first start (walk, 8 threads + sample + fingerprint + write)"),
    ("first_1t", "first", 1, "coordl first start, walk on 1 thread"),
    ("rescan", "rescan", 8, "coordl `rescan=True` (also compares ctime/inode with the old scan)"),
    ("restart", "restart", 8, "coordl restart, tree unchanged (persisted manifest)"),
    ("sample", "sample", 8, "of which: fingerprint content sample (1024 files, 8 threads)"),
    ("sample_1t", "sample", 1, "fingerprint content sample on 1 thread"),
]


def _summary(label: str, run: dict, stat: dict | None) -> dict:
    """Medians over the rounds, and the median (min, max) of the per-round ratios to the stat loop."""
    out = {"label": label, "scans": run["scans"], "cold_runs_s": run["cold"], "warm_runs_s": run["warm"]}
    for which in ("cold", "warm"):
        xs = run[which]
        out[f"{which}_s"] = None if None in xs else float(np.median(xs))
        if stat is not None and None not in xs and None not in stat[which]:
            ratios = [x / b for x, b in zip(xs, stat[which])]
            out[f"{which}_ratio"] = {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios)}
    return out


def _ratio(v: dict, which: str) -> str:
    r = v.get(f"{which}_ratio")
    if r is None:
        return "-"
    return f"{r['median']:.2f}x" + (f" ({r['min']:.2f}-{r['max']:.2f})" if r["min"] != r["max"] else "")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_281_000)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--root", default=None, help="where the tree is built (default /tmp/coordl-scale-FILES)")
    ap.add_argument("--loader-items", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the start-up rows "
                    "(each: cold, then warm best of two); the table gives medians and per-round ratios")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows", default=None, help="comma-separated start-up rows only (tv,stat,first,...; "
                    "serve: the daemon's start and `coordl status`): skips the loader and index figures")
    ap.add_argument("--drop-page-cache", action="store_true",
                    help="measure cold too: before each cold process run `sync; echo 3 > "
                    "/proc/sys/vm/drop_caches`, which drops the page cache, dentries and inodes of the "
                    "WHOLE MACHINE, not only this tree's (needs root; off by default: warm figures only)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=8, help=argparse.SUPPRESS)
    a = ap.parse_args()
    root = a.root or f"/tmp/coordl-scale-{a.files}"
    if a.child:
        print(json.dumps(child(a.child, root, a.store, a.threads)))
        return
    store = root + ".manifests"
    tree = build(root, a.files, a.classes)
    print(f"tree: {tree}", flush=True)
    can_drop = a.drop_page_cache and _drop_caches()
    if a.drop_page_cache and not can_drop:
        print("--drop-page-cache: /proc/sys/vm/drop_caches is not writable (needs root): warm figures only",
              file=sys.stderr, flush=True)
    cold_how = ("echo 3 > /proc/sys/vm/drop_caches before each process (--drop-page-cache)" if can_drop
                else "not measured (needs --drop-page-cache, as root)" if not a.drop_page_cache
                else "not measured (drop_caches needs root)")
    res: dict = {"files": a.files, "classes": a.classes, "tree": tree, "cold": cold_how, "rows": {}}
    measure("first", root, store, 8, False)       # so that restart/rescan/sample find a manifest
    rows = [r for r in ROWS if not a.rows or r[0] in a.rows.split(",")]
    runs: dict = {key: {"cold": [], "warm": [], "scans": None} for key, *_ in rows}
    for k in range(a.rounds):  # interleaved: every row once per round, so drift hits all alike
        for key, kind, threads, label in rows:
            cold = measure(kind, root, store, threads, True)["s"] if can_drop else None
            warm = [measure(kind, root, store, threads, False) for _ in range(2)]
            runs[key]["cold"].append(cold)
            runs[key]["warm"].append(min(w["s"] for w in warm))
            runs[key]["scans"] = {x: warm[-1].get(x) for x in ("walks", "loads")}
            print(f"round {k + 1}/{a.rounds} {label}: cold {_fmt(cold)} warm {_fmt(runs[key]['warm'][-1])}",
                  flush=True)
    for key, *_, label in rows:
        res["rows"][key] = _summary(label, runs[key], runs.get("stat"))
    if not a.rows or "serve" in a.rows.split(","):
        res["serve"] = serve_figures(root, store, can_drop)
        print(f"serve: {res['serve']}", flush=True)
    res["machine"] = report.machine(list(range(os.cpu_count() or 1)))
    res["command"] = report.command()
    if a.rows:
        print(json.dumps({k: res[k] for k in ("rows", "serve") if k in res}, indent=1))
        return
    res["loader"] = {w: loader_memory(root, store, w, a.loader_items) for w in ("coordl", "torch")}
    print(f"loader: {res['loader']}", flush=True)
    res["index"] = index_figures(root, store)
    report.write(a.out, res, markdown(res))


def markdown(r: dict) -> str:
    rows = r["rows"]
    rounds = len(next(iter(rows.values()))["warm_runs_s"])
    lines = [f"### Scale: {r['files']:,} files in {r['classes']:,} folders (`bench/scale.py`)", "",
             f"One {r['tree']['jpeg_bytes']:,}-byte JPEG {r['tree']['how']}; cold: {r['cold']}; "
             f"warm: best of two. Each figure in a fresh process, timing the call only; {rounds} interleaved "
             "rounds (every row once per round): medians, and the median (min-max) of the per-round "
             "ratios to the stat loop of the same round.", "",
             "| start of the dataset | cold | warm | cold / stat loop | warm / stat loop |",
             "|---|---:|---:|---:|---:|"]
    for v in rows.values():
        lines.append(f"| {v['label']} | {_fmt(v['cold_s'])} | {_fmt(v['warm_s'])} | {_ratio(v, 'cold')} | "
                     f"{_ratio(v, 'warm')} |")
    lo, ix, sv = r["loader"], r["index"], r["serve"]
    lines += ["", "| grows with the item count | coordl | torch, list of tuples |", "|---|---:|---:|",
              f"| worker start (iter to first batch, 2 workers) | {lo['coordl']['start_s']:.2f} s | "
              f"{lo['torch']['start_s']:.2f} s |"]
    for k, name in (("uss", "USS"), ("pss", "PSS")):
        lines.append(f"| per-worker {name} at the first batch -> after {lo['coordl']['items']:,} items | "
                     f"{lo['coordl'][k + '_first']:.0f} -> {lo['coordl'][k + '_last']:.0f} MiB | "
                     f"{lo['torch'][k + '_first']:.0f} -> {lo['torch'][k + '_last']:.0f} MiB |")
    lines += [f"| MinIO index (offset + length per item) | {ix['minio_index_mib']:.1f} MiB | |",
              f"| MinIO segment create / attach | {ix['minio_create_s'] * 1000:.0f} / "
              f"{ix['minio_attach_s'] * 1000:.0f} ms | |",
              f"| `coordl cache ls` (whole command) | {ix['cache_ls_s']:.2f} s | |",
              f"| `coordl serve --data ROOT` to listening (manifest load, ring, 2 workers), cold / warm | "
              f"{_fmt(sv['start_cold_s'])} / {_fmt(sv['start_warm_s'])} | |",
              f"| `coordl status` against it (whole command), cold / warm | "
              f"{_fmt(sv['status_cold_s'])} / {_fmt(sv['status_warm_s'])} | |",
              f"| epoch plan (`coordl.epochs.sampling.epoch_order`) | {ix['epoch_order_ms']:.0f} ms per epoch | |",
              f"| partition placement, 4 nodes, every item | {ix['placement_4_nodes_ms']:.0f} ms | |"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
