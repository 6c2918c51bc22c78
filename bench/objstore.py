"""Object-store fetch throughput: coordl's concurrent read_many vs one GET at a time, and whole loaders.

    .venv/bin/python bench/objstore.py --images 400 --latency 0.020 [--bandwidth BYTES_PER_S] [--server moto]
    .venv/bin/python bench/objstore.py --loaders --images 400 --latency 0.020 --batch 32 --workers 2

Starts a moto S3 server (tests/s3server.py) on a free loopback port, uploads a synthetic JPEG
ImageFolder (coordl.cli.make_dataset) to it, and puts a proxy in a process of its own in front of it
that waits `--latency` before it answers each request (a remote store's round trip) and paces each
response body at `--bandwidth` bytes/s per connection (if given). What answers behind the proxy
(`--server`):
- `static` (default): GetObject (whole and Range) and HeadObject of the uploaded objects are answered
  by the proxy itself from the uploaded folder, with moto's own ETag, Last-Modified and Size
  (bench/lib/objstore_static.py; its docstring says what is and is not emulated); listings and
  everything else go to moto. A GET then costs the machine ~0.2 ms of CPU in the proxy instead of
  ~3-4 ms in moto and the old proxy, so the loaders keep the cores, as against a remote store;
- `moto`: every request forwarded to moto (bench/lib/objstore_proxy.ProxyProcess), as before.
Every line gives CPU seconds per side (bench/lib/cpu_sides.py: user + system of the processes and
their children, before/after each run or timed epoch): `loader` (this process: the client, the
DataLoader's workers), `server` (moto) and `proxy`; server + proxy is the emulated store, the
bench's own overhead on this machine (on a real store that CPU is elsewhere): subtract it.

Without `--loaders`, on the same objects:
- `coordl read_many`: cache/objstore.ObjectStore.read_many over all keys in batches of `--batch`,
  at most `--in-flight` GETs at once;
- `one GET at a time`: s3fs's `open(...).read()` per object, in order, what a torch Dataset that
  opens each object in __getitem__ does (per DataLoader worker).
Prints objects/s of each and their ratio; GETs are counted at the proxy so a run that fetched
nothing cannot pass for a fast one.

With `--loaders`, whole loaders on the same files instead (train transform, `--workers` workers,
`--batch` images per batch, one warm-up epoch, then `--epochs` timed epochs each, images/s median,
CPU the mean of the timed epochs, GETs and requests reaching moto per epoch, warm-up first):
- `coordl s3`: coordl.DataLoader(coordl.ImageFolder("s3://...", storage_options=...)) through the proxy;
- `coordl local`: the same over the local folder the objects were uploaded from;
- `torch s3fs`: torch.utils.data.DataLoader over a torchvision-style Dataset whose __getitem__ opens
  its object with s3fs, decodes with PIL and crops/flips (what a user writes; no torchvision here,
  so RandomResizedCrop's sampling is written out);
- `coordl s3 MinIO f=0.5`: coordl s3 with a MinIO cache of half the bytes (later epochs GET the rest).
Then `--pairs` interleaved pairs of a coordl s3 epoch and a coordl local epoch (both loaders alive,
one warm-up epoch each, the order alternating; ../shared/benchmarking.md): the median, min and max
of the per-pair s3 / local ratios, which a drift of the shared machine's speed moves less than the
ratio of the two loaders' medians measured one after the other.
COORDL_S3_CLIENT in the environment picks coordl's S3 client (printed in the header line).

With `--loaders --webdataset`, the images as WebDataset tar shards of `--per-shard` images (bench/webdataset.py
`write_shards`) in the bucket instead, and coordl.WebDataset("s3://bench/wds/train-{...}.tar") loaders with
`read_ahead` False and True (the same measures; the static proxy answers the shards' ranged GETs).

With `--listing N`, coordl's listing of N objects instead (`--classes` default: N / 1281, ImageNet's
images per class, so each class prefix takes the same two LIST pages of 1000 keys as ImageNet's):
coordl.ImageFolder("s3://bench/train", max_in_flight=...) built (the root check, list_classes, then
every class prefix, `--in-flight` at once) one prefix at a time without and with `--latency`, and
`--in-flight` at once, each against a fresh proxy; LIST requests counted at the proxy (exactly the
pages needed + the root's listing twice, else the run fails, as it does unless the dataset holds every
key, class, target and size in walk order), wall seconds, CPU seconds of the client and the store,
and the seconds for 1,281,000 objects in 1000 classes from a model fed with the measured page (`_model`).
- `--server static` (default): no moto, no upload: the proxy answers the listing itself from a
  synthetic bucket of N ImageNet-like keys (train/n01440764/n01440764_10026.JPEG, sizes and ETags
  from the key; bench/lib/objstore_listing.py), so 1,281,000 objects are measured directly;
- `--server moto`: N objects of 3 bytes uploaded to moto, every LIST forwarded to it (moto's time
  per page grows with the bucket: 100,000 objects do not list within the 10 s request timeout).
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.util
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from lib.cpu_sides import SIDES, Sides  # noqa: E402
from lib.objstore_proxy import ProxyProcess  # noqa: E402
from lib.objstore_static import StaticProxyProcess, build_index  # noqa: E402

SERVERS = {"static": "GET/HEAD of objects answered by the proxy from the uploaded folder, the rest by moto",
           "moto": "every request forwarded by the proxy to moto"}

# tests/s3server.py by its file: tests/ on sys.path would make tests/coordl/ a namespace package `coordl`
_spec = importlib.util.spec_from_file_location("s3server", os.path.join(os.path.dirname(HERE), "tests", "s3server.py"))
s3server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s3server)
MotoServer, upload_folder = s3server.MotoServer, s3server.upload_folder

from coordl.cache.storage.objstore import ObjectStore  # noqa: E402
from coordl.cli.make_dataset import make_dataset  # noqa: E402


def _coordl(store: ObjectStore, keys: list[str], batch: int) -> int:
    total = 0
    for i in range(0, len(keys), batch):
        total += sum(map(len, store.read_many(keys[i:i + batch])))
    return total


def _one_at_a_time(url: str, options: dict, keys: list[str]) -> int:
    import s3fs
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    total = 0
    for k in keys:
        with fs.open(f"{url}/{k}", "rb") as f:
            total += len(f.read())
    return total


class S3fsImages:
    """What a user writes: a map-style Dataset that opens each object with s3fs in __getitem__."""

    def __init__(self, url: str, options: dict, keys: list[str], size: int = 224) -> None:
        self.url, self.options, self.keys, self.size, self.fs = url, options, keys, size, None
        classes = sorted({k.split("/", 1)[0] for k in keys})
        self.labels = [classes.index(k.split("/", 1)[0]) for k in keys]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        import io
        import math
        import random

        import numpy as np
        import torch
        from PIL import Image

        if self.fs is None:  # one filesystem per worker process
            import s3fs
            self.fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.options)
        with self.fs.open(f"{self.url}/{self.keys[i]}", "rb") as f:
            img = Image.open(io.BytesIO(f.read())).convert("RGB")
        w, h = img.size
        for _ in range(10):  # torchvision RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3))
            area = w * h * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = random.randint(0, w - cw), random.randint(0, h - ch)
                break
        else:
            cw, ch, x, y = w, h, 0, 0
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), self.labels[i]


_PROBE = """import json, sys
from coordl.cache.storage.objstore import ObjectStore
url, options, key = json.loads(sys.argv[1])
store = ObjectStore.from_url(url, options)
store.read(key)
print(getattr(store, "fetch_client", "s3fs"))
store.close()
"""


def _client_in_use(url: str, options: dict, key: str) -> str:
    """The client coordl GETs with, for these options and this environment (COORDL_S3_CLIENT), as a
    fresh process finds it (a DataLoader's workers are forked from a parent that only listed, so they
    choose as a fresh process does); a LIST and a GET, before any count starts."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps([url, options, key])], capture_output=True,
                         text=True, timeout=120)
    if out.returncode:
        raise SystemExit(f"coordl's S3 client could not read {url}/{key}: {out.stderr.strip()[-2000:]}")
    return out.stdout.strip()


def _epochs(loader, n: int, sides: Sides, proxy) -> list[dict]:
    """Per epoch (a warm-up first, not timed: worker start-up, first reads, then n timed):
    images/s, CPU seconds per side ({"server", "proxy", "loader"}) and the proxy's requests by method."""
    out = []
    for _ in range(n + 1):
        proxy.reset_counts()
        before, t0, seen = sides.snapshot(), time.perf_counter(), 0
        for images, _ in loader:
            seen += len(images)
        out.append({"images_per_s": seen / (time.perf_counter() - t0), "cpu_s": sides.since(before),
                    "requests": dict(proxy.counts),
                    "to_moto": proxy.routes["moto"] if hasattr(proxy, "routes") else sum(proxy.counts.values())})
    return out


def _summary(epochs: list[dict], images: int) -> dict:
    """Medians of the timed epochs' rates, means of their CPU; requests of every epoch."""
    import statistics

    timed = epochs[1:]
    cpu = {side: statistics.fmean(e["cpu_s"][side] for e in timed) for side in SIDES}
    requests = statistics.fmean(sum(e["requests"].values()) for e in timed)
    return {"images_per_s": statistics.median(e["images_per_s"] for e in timed),
            "epochs": [e["images_per_s"] for e in timed], "gets": [e["requests"].get("GET", 0) for e in epochs],
            "to_moto": [e["to_moto"] for e in epochs],
            "requests_per_epoch": requests, "cpu_s_per_epoch": cpu,
            "loader_ms_per_image": cpu["loader"] / images * 1000,
            "store_ms_per_request": (cpu["server"] + cpu["proxy"]) / requests * 1000 if requests else 0.0,
            "per_epoch": epochs}


def loaders(args, root: str, server, proxy, keys: list[str]) -> dict:
    import torch

    import coordl

    opts = server.options() | {"endpoint_url": proxy.url}
    url = "s3://bench/train"
    common = {"batch_size": args.batch, "shuffle": True, "num_workers": args.workers, "persistent_workers": True}

    def s3(**kw):
        ds = coordl.ImageFolder(url, storage_options=opts, max_in_flight=args.in_flight)
        return coordl.DataLoader(ds, **kw, **common)

    half = sum(os.path.getsize(os.path.join(root, k)) for k in keys) // 2
    runs = {
        "coordl s3": s3,
        "coordl local": lambda: coordl.DataLoader(coordl.ImageFolder(root), **common),
        "torch s3fs": lambda: torch.utils.data.DataLoader(S3fsImages(url, opts, keys), **common),
        "coordl s3 MinIO f=0.5": lambda: s3(cache=half),
    }
    client = _client_in_use(url, opts, keys[0])
    results = _measure(runs, args, server, proxy, len(keys))
    s3_rate = results["coordl s3"]["images_per_s"]
    ratios = {"s3 / local": s3_rate / results["coordl local"]["images_per_s"],
              "s3 / torch s3fs": s3_rate / results["torch s3fs"]["images_per_s"]}
    print(f"{len(keys)} images, latency {args.latency * 1000:.0f} ms"
          f"{'' if not args.bandwidth else f', {args.bandwidth / 1e6:.0f} MB/s per connection'}, "
          f"{args.workers} workers, batch {args.batch}, in flight {args.in_flight}, cpus "
          f"{len(os.sched_getaffinity(0))}, {args.epochs} timed epochs after 1 warm-up; server {args.server} "
          f"({SERVERS[args.server]}); coordl's S3 client {client} (COORDL_S3_CLIENT="
          f"{os.environ.get('COORDL_S3_CLIENT', '')!r})")
    _print(results)
    print("  ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print("  store = the emulated remote store (server + proxy): the bench's own overhead on this machine, to subtract")
    pairs = _pairs(runs["coordl s3"], runs["coordl local"], args.pairs) if args.pairs else None
    if pairs is not None:
        r = pairs["ratios"]
        print(f"  interleaved pairs (s3 epoch, local epoch, the order alternating; {len(r)} pairs after a warm-up "
              f"epoch each): s3 / local median {pairs['median']:.2f}x (min {min(r):.2f}, max {max(r):.2f}; "
              f"per pair {', '.join(f'{x:.2f}' for x in r)})")
    return {"results": results, "ratios": ratios, "client": client, "pairs": pairs}


def _pairs(make_a, make_b, n: int) -> dict:
    """A/B epochs interleaved (benchmarking.md): both loaders alive (persistent workers), one warm-up
    epoch each, then n pairs, A first in even pairs and B first in odd ones; per pair, A's images/s
    over B's. So a drift of the machine's speed hits both sides of a pair alike."""
    import statistics

    def rate(loader) -> float:
        t0, seen = time.perf_counter(), 0
        for images, _ in loader:
            seen += len(images)
        return seen / (time.perf_counter() - t0)

    a, b = make_a(), make_b()
    try:
        rate(a), rate(b)
        ratios = []
        for k in range(n):
            if k % 2 == 0:
                ra, rb = rate(a), rate(b)
            else:
                rb, ra = rate(b), rate(a)
            ratios.append(ra / rb)
        return {"ratios": ratios, "median": statistics.median(ratios)}
    finally:
        del a, b
        gc.collect()


def _measure(runs: dict, args, server, proxy, images: int) -> dict:
    """`_summary` of each loader `runs[name]()` makes, one after the other."""
    results = {}
    sides = Sides(server=server.proc.pid, proxy=proxy.pid)
    for name, make in runs.items():
        loader = make()
        try:
            results[name] = _summary(_epochs(loader, args.epochs, sides, proxy), images)
        finally:
            if getattr(loader.dataset, "cache", None) is not None:
                loader.dataset.cache.drop()
            del loader
            gc.collect()  # its workers end now, not during the next loader's run
    return results


def _print(results: dict) -> None:
    for name, r in results.items():
        epochs = ", ".join(f"{x:.0f}" for x in r["epochs"])
        used = r["cpu_s_per_epoch"]
        print(f"  {name:21s} {r['images_per_s']:7.1f} images/s (epochs {epochs}); GETs per epoch {r['gets']}, "
              f"requests to moto {r['to_moto']}; "
              f"CPU s/epoch: loader {used['loader']:.2f} ({r['loader_ms_per_image']:.2f} ms/image), "
              f"store {used['server'] + used['proxy']:.2f} = server {used['server']:.2f} + proxy {used['proxy']:.2f}"
              f" ({r['store_ms_per_request']:.2f} ms/request)")


def webdatasets(args, server, proxy, shards: list[str]) -> dict:
    """coordl.WebDataset over the shards in the bucket, read_ahead off and on (the module docstring)."""
    import coordl

    opts = server.options() | {"endpoint_url": proxy.url}
    url = f"s3://bench/wds/train-{{000000..{len(shards) - 1:06d}}}.tar"
    common = {"batch_size": args.batch, "shuffle": True, "num_workers": args.workers, "persistent_workers": True}

    def s3(read_ahead: bool):
        ds = coordl.WebDataset(url, storage_options=opts, max_in_flight=args.in_flight, index_cache="off",
                               read_ahead=read_ahead)
        return coordl.DataLoader(ds, **common)

    runs = {f"webdataset read_ahead={on}": lambda on=on: s3(on) for on in (False, True)}
    results = _measure(runs, args, server, proxy, args.images)
    client = _client_in_use("s3://bench/wds", opts, shards[0])
    print(f"{args.images} images in {len(shards)} shards, latency {args.latency * 1000:.0f} ms, "
          f"{args.workers} workers, batch {args.batch}, in flight {args.in_flight}, "
          f"cpus {len(os.sched_getaffinity(0))}, "
          f"{args.epochs} timed epochs after 1 warm-up; server {args.server}; coordl's S3 client {client}")
    _print(results)
    on, off = (results[f"webdataset read_ahead={v}"] for v in (True, False))
    ratio = on["images_per_s"] / off["images_per_s"]
    print(f"  read_ahead on / off: {ratio:.2f}x images/s, loader CPU {on['loader_ms_per_image']:.2f} vs "
          f"{off['loader_ms_per_image']:.2f} ms/image")
    return {"results": results, "ratio": ratio, "client": client}


def _write_shards(root: str, out: str, per_shard: int) -> None:
    """bench/webdataset.py's write_shards (by its file: running it would import the webdataset package)."""
    spec = importlib.util.spec_from_file_location("coordl_bench_webdataset", os.path.join(HERE, "webdataset.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write_shards(root, out, per_shard)


def _fill(server, n: int, classes: int, threads: int = 16) -> list[str]:
    """Put n objects of 3 bytes under bench/train/<class>/ (round robin over the classes), from
    `threads` threads straight to the server (not through the proxy); their keys below train/, sorted."""
    from concurrent.futures import ThreadPoolExecutor

    client = server.client()
    client.create_bucket(Bucket="bench")
    keys = [f"class_{i % classes:04d}/img_{i:08d}.jpg" for i in range(n)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: client.put_object(Bucket="bench", Key=f"train/{k}", Body=b"jpg"), keys))
    return sorted(keys)


def _model(lists_per_class: int, latency: float, page_s: float, client_s: float, in_flight: int, cpus: int,
           classes: int = 1000) -> dict:
    """Seconds to list `classes` prefixes of `lists_per_class` LIST pages each (+ 2 listings of the
    classes: the root check and list_classes), each page costing `latency` + `page_s` (a page's time
    without latency: the store's and the client's) of which `client_s` is the client's CPU.
    A prefix's pages form a chain (each needs the previous continuation token); prefixes run
    `in_flight` at once; the client parses every page on its one event-loop thread.
    - one_at_a_time: every page in turn;
    - parallel: ceil(classes / in_flight) rounds of one chain, on a store that serves in_flight
      pages at once as fast as one (S3), and at least the client's CPU for every page;
    - parallel_here: at least every page's time over `cpus` cores (an emulator on this machine)."""
    page = latency + page_s
    lists = classes * lists_per_class + 2
    parallel = max((-(-classes // in_flight) * lists_per_class + 2) * page, lists * client_s)
    return {"lists": lists, "one_at_a_time": lists * page, "parallel": parallel,
            "parallel_here": max(parallel, lists * page_s / cpus)}


def _listing_store(args, classes: int):
    """(start(latency) -> a started proxy, the MotoServer or None, the expected keys below train/ in
    walk order, their sizes or None, seconds to set up)."""
    t0 = time.perf_counter()
    if args.server == "static":
        from lib.objstore_listing import SyntheticBucket, synthetic_keys

        keys = [k.removeprefix("train/") for k in synthetic_keys(args.listing, classes)]
        sizes = [SyntheticBucket.size("train/" + k) for k in keys]
        return (lambda latency: StaticProxyProcess(None, {}, latency=latency, listing=(args.listing, classes)).start(),
                None, keys, sizes, time.perf_counter() - t0)
    server = MotoServer().start()
    keys = _fill(server, args.listing, classes)
    return (lambda latency: ProxyProcess(server.url, latency=latency).start(), server, keys, None,
            time.perf_counter() - t0)


def listing(args) -> dict:
    """coordl.ImageFolder("s3://bench/train") built (its listing: the root check, the classes, every
    class prefix) one prefix at a time and `--in-flight` at once; each run against a fresh proxy."""
    import math

    import torch  # noqa: F401 (what the first ImageFolder imports, not timed)

    import coordl

    coordl.ImageFolder  # noqa: B018 (its module, imported now)
    classes = args.classes if args.classes_given else max(1, round(args.listing / 1281))
    start, server, keys, sizes, setup_s = _listing_store(args, classes)
    names = sorted({k.split("/", 1)[0] for k in keys})
    per_name = collections.Counter(k.split("/", 1)[0] for k in keys)
    pages = sum(-(-c // 1000) for c in per_name.values())  # each prefix: ceil(objects / 1000) pages
    roots = -(-classes // 1000)  # the root check (list_classes answers from it): ceil(classes / 1000) pages
    store = "synthetic listing in the proxy (bench/lib/objstore_listing.py), no moto" if server is None else \
        f"moto behind the proxy (uploaded in {setup_s:.0f} s)"
    print(f"listing {len(keys)} objects in {classes} class prefixes (~{len(keys) // classes} each), server "
          f"{args.server}: {store}; cpus {len(os.sched_getaffinity(0))}; coordl.ImageFolder(s3://...): {pages} "
          f"pages of <= 1000 keys + {roots} of the classes' listing (the root check)", flush=True)
    results = {}
    try:
        runs = {"base": ("no latency, one at a time", 1, 0.0), "one": ("one at a time", 1, args.latency),
                "parallel": ("parallel", args.in_flight, args.latency)}
        for name, in_flight, latency in (runs[r] for r in args.runs.split(",")):
            proxy = start(latency)
            try:
                options = (server.options() if server else {"key": "k", "secret": "s"}) | {"endpoint_url": proxy.url}
                sides = Sides(server=server.proc.pid if server else None, proxy=proxy.pid)
                warm = ObjectStore.from_url("s3://bench/train", options)  # imports, not timed
                warm.list_classes()
                warm.close()
                proxy.reset_counts()
                before, t0 = sides.snapshot(), time.perf_counter()
                ds = coordl.ImageFolder("s3://bench/train", storage_options=options, max_in_flight=in_flight,
                                        manifest_cache="off")
                dt, cpu, counts = time.perf_counter() - t0, sides.since(before), dict(proxy.counts)
                most = proxy.max_in_flight
            finally:
                proxy.stop()
            m = ds.manifest
            if (len(m) != len(keys) or list(ds.classes) != names or [m.relpath(i) for i in range(len(m))] != keys
                    or ds.targets != [names.index(k.split("/", 1)[0]) for k in keys]
                    or (sizes is not None and m.sizes.tolist() != sizes)):
                raise SystemExit(f"{name}: listed {len(m)} of {len(keys)} objects, or not the expected keys, "
                                 "classes, targets or sizes in walk order: broken run")
            retries = ds.objects.store.stats()["retries"]  # a timed-out or failed listing call, listed again
            ds.objects.store.close()
            del ds, m
            gc.collect()
            need = pages + roots
            if set(counts) != {"GET"} or counts["GET"] < need or (counts["GET"] > need and not retries):
                raise SystemExit(f"{name}: requests {counts}, not the {pages} pages + {roots} of the classes' listings")
            results[name] = {"seconds": dt, "lists": counts.get("GET", 0), "requests": counts, "max_in_flight": most,
                             "in_flight": in_flight, "latency": latency, "cpu_s": cpu, "retries": retries}
            print(f"  {name:26s} (in flight {in_flight:2d}, latency {latency * 1000:2.0f} ms): {dt:7.2f} s, "
                  f"{counts['GET']} LIST requests ({retries} listing calls retried), at most {most} at once at the "
                  f"proxy; CPU s: client {cpu['loader']:.2f}, store {cpu['server'] + cpu['proxy']:.2f}", flush=True)
    finally:
        if server is not None:
            server.stop()
    base = results.get("no latency, one at a time")
    page_s, client_s = (base["seconds"] / base["lists"], base["cpu_s"]["loader"] / base["lists"]) if base else (0, 0)
    cpus = len(os.sched_getaffinity(0))
    model = _model(math.ceil(1281 / 1000), args.latency, page_s, client_s, args.in_flight, cpus) if base else None
    speedup = None
    if "one at a time" in results and "parallel" in results:
        speedup = results["one at a time"]["seconds"] / results["parallel"]["seconds"]
        print(f"  parallel / one at a time: {speedup:.1f}x faster")
    if model is not None:
        print(f"  per page without latency: {page_s * 1000:.0f} ms, of which client CPU {client_s * 1000:.0f} ms; "
              f"model, 1,281,000 objects in 1000 classes ({model['lists']} LISTs, {args.latency * 1000:.0f} ms + "
              f"{page_s * 1000:.0f} ms each): one at a time {model['one_at_a_time']:.0f} s; {args.in_flight} in "
              f"flight {model['parallel']:.0f} s on a store serving them at once (client CPU included), "
              f"{model['parallel_here']:.0f} s with this emulator on {cpus} cores")
    return {"results": results, "classes": classes, "setup_s": setup_s, "speedup": speedup, "page_s": page_s,
            "client_s": client_s, "model": model}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--classes", type=int, default=None, help="class folders (default 4; --listing: N / 1281)")
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--latency", type=float, default=0.020, help="seconds added to every request")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s per connection (default: no cap)")
    ap.add_argument("--in-flight", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256, help="objects per read_many (with --loaders: images per batch)")
    ap.add_argument("--loaders", action="store_true", help="compare whole loaders (see the docstring)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per loader (--loaders)")
    ap.add_argument("--pairs", type=int, default=6,
                    help="--loaders: then this many interleaved pairs of coordl s3 / coordl local epochs (0: none)")
    ap.add_argument("--server", choices=sorted(SERVERS), default="static",
                    help="static: " + SERVERS["static"] + " (default); moto: " + SERVERS["moto"])
    ap.add_argument("--webdataset", action="store_true",
                    help="with --loaders: WebDataset shards in the bucket, read_ahead off vs on (see the docstring)")
    ap.add_argument("--per-shard", type=int, default=100, help="images per shard (--webdataset)")
    ap.add_argument("--listing", type=int, default=0, metavar="N", help="time the listing of N objects instead")
    ap.add_argument("--runs", default="base,one,parallel",
                    help="--listing: which runs, of base (one at a time, no latency: feeds the model), one (one "
                         "at a time) and parallel (--in-flight at once)")
    args = ap.parse_args(argv)
    args.classes_given = args.classes is not None
    args.classes = args.classes or 4
    if args.listing:
        return listing(args)
    w, h = (int(v) for v in args.size.split("x"))

    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "train")
        nbytes = make_dataset(root, images=args.images, classes=args.classes, size=(w, h), workers=1, progress=False)
        server = MotoServer().start()
        proxy = None
        try:
            folder, prefix = (os.path.join(tmp, "wds"), "wds") if args.webdataset else (root, "train")
            if args.webdataset:
                _write_shards(root, folder, args.per_shard)
            keys = upload_folder(server, "bench", folder, prefix)
            # the proxy in a process of its own, so its CPU is measured apart from the client's
            if args.server == "static":
                index = build_index(server.client(), "bench", prefix, folder)
                proxy = StaticProxyProcess(server.url, index, latency=args.latency, bandwidth=args.bandwidth).start()
            else:
                proxy = ProxyProcess(server.url, latency=args.latency, bandwidth=args.bandwidth).start()
            if args.loaders and args.webdataset:
                return webdatasets(args, server, proxy, sorted(keys))
            if args.loaders:
                return loaders(args, root, server, proxy, keys)
            return objects(args, server, proxy, keys, nbytes)
        finally:
            if proxy is not None:
                proxy.stop()
            server.stop()


def objects(args, server, proxy, keys: list[str], nbytes: int) -> dict:
    """coordl's read_many against one GET at a time, on the same objects (the module docstring)."""
    options = server.options() | {"endpoint_url": proxy.url}
    store = ObjectStore.from_url("s3://bench/train", options, max_in_flight=args.in_flight)
    sides = Sides(server=server.proc.pid, proxy=proxy.pid)
    results = {}
    for name, run in (("coordl read_many", lambda: _coordl(store, keys, args.batch)),
                      ("one GET at a time", lambda: _one_at_a_time("bench/train", options, keys))):
        proxy.reset_counts()
        before, t0 = sides.snapshot(), time.perf_counter()
        got = run()
        dt = time.perf_counter() - t0
        cpu, counts = sides.since(before), proxy.counts
        if got != nbytes or counts["GET"] < len(keys):
            raise SystemExit(f"{name}: read {got} of {nbytes} bytes with {counts['GET']} GETs: broken run")
        requests = sum(counts.values())
        results[name] = {"objects_per_s": len(keys) / dt, "seconds": dt, "gets": counts["GET"],
                         "heads": counts["HEAD"], "cpu_s": cpu,
                         "cpu_ms_per_request": {side: cpu[side] / requests * 1000 for side in SIDES}}
    client = getattr(store, "fetch_client", "s3fs")
    store.close()
    ratio = results["coordl read_many"]["objects_per_s"] / results["one GET at a time"]["objects_per_s"]
    print(f"{args.images} objects of {nbytes / args.images / 1024:.0f} KiB, latency {args.latency * 1000:.0f} ms"
          f"{'' if not args.bandwidth else f', {args.bandwidth / 1e6:.0f} MB/s per connection'}, "
          f"in flight {args.in_flight}, cpus {len(os.sched_getaffinity(0))}; server {args.server} "
          f"({SERVERS[args.server]}); coordl's S3 client {client} (COORDL_S3_CLIENT="
          f"{os.environ.get('COORDL_S3_CLIENT', '')!r})")
    for name, r in results.items():
        ms = r["cpu_ms_per_request"]
        print(f"  {name:18s} {r['objects_per_s']:8.1f} objects/s  ({r['seconds']:.2f} s, {r['gets']} GETs, "
              f"{r['heads']} HEADs; CPU ms per request: client {ms['loader']:.2f}, server {ms['server']:.2f}, "
              f"proxy {ms['proxy']:.2f})")
    print(f"  ratio: {ratio:.1f}x")
    return {"results": results, "ratio": ratio, "client": client}


if __name__ == "__main__":
    main()
