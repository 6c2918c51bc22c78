"""Object-store fetch throughput: coordl's concurrent read_many vs one GET at a time (skeleton).

    .venv/bin/python bench/objstore.py --images 400 --latency 0.020 [--bandwidth BYTES_PER_S]

Starts a moto S3 server (tests/s3server.py) on a free loopback port, uploads a synthetic JPEG
ImageFolder (coordl.cli.make_dataset), and puts bench/lib/objstore_proxy.FaultProxy in front of it, which
waits `--latency` per request (a remote store's round trip). Then, on the same objects:
- `coordl read_many`: cache/objstore.ObjectStore.read_many over all keys in batches of `--batch`,
  at most `--in-flight` GETs at once;
- `one GET at a time`: s3fs's `open(...).read()` per object, in order, what a torch Dataset that
  opens each object in __getitem__ does (per DataLoader worker).
Prints objects/s of each and their ratio; GETs are counted at the proxy so a run that fetched
nothing cannot pass for a fast one. This is the fetch layer only: the full issue-25 bench (coordl
over S3 vs local, a torch DataLoader, MinIO at f=0.5) builds on it once ImageFolder takes URLs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from lib.objstore_proxy import FaultProxy  # noqa: E402
from s3server import MotoServer, upload_folder  # noqa: E402

from coordl.cache.objstore import ObjectStore  # noqa: E402
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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--latency", type=float, default=0.020, help="seconds added to every request")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s per connection (default: no cap)")
    ap.add_argument("--in-flight", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.split("x"))

    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "train")
        nbytes = make_dataset(root, images=args.images, classes=args.classes, size=(w, h), workers=1, progress=False)
        server = MotoServer().start()
        proxy = FaultProxy(server.url, latency=args.latency, bandwidth=args.bandwidth).start()
        try:
            keys = upload_folder(server, "bench", root, "train")
            options = server.options() | {"endpoint_url": proxy.url}
            store = ObjectStore.from_url("s3://bench/train", options, max_in_flight=args.in_flight)
            results = {}
            for name, run in (("coordl read_many", lambda: _coordl(store, keys, args.batch)),
                              ("one GET at a time", lambda: _one_at_a_time("bench/train", options, keys))):
                proxy.reset_counts()
                t0 = time.perf_counter()
                got = run()
                dt = time.perf_counter() - t0
                if got != nbytes or proxy.counts["GET"] < len(keys):
                    gets = proxy.counts["GET"]
                    raise SystemExit(f"{name}: read {got} of {nbytes} bytes with {gets} GETs: broken run")
                results[name] = {"objects_per_s": len(keys) / dt, "seconds": dt, "gets": proxy.counts["GET"],
                                 "heads": proxy.counts["HEAD"]}
            store.close()
        finally:
            proxy.stop()
            server.stop()
    ratio = results["coordl read_many"]["objects_per_s"] / results["one GET at a time"]["objects_per_s"]
    print(f"{args.images} objects of {nbytes / args.images / 1024:.0f} KiB, latency {args.latency * 1000:.0f} ms"
          f"{'' if not args.bandwidth else f', {args.bandwidth / 1e6:.0f} MB/s per connection'}, "
          f"in flight {args.in_flight}, cpus {os.cpu_count()}")
    for name, r in results.items():
        print(f"  {name:18s} {r['objects_per_s']:8.1f} objects/s  ({r['seconds']:.2f} s, {r['gets']} GETs, "
              f"{r['heads']} HEADs)")
    print(f"  ratio: {ratio:.1f}x")
    return {"results": results, "ratio": ratio}


if __name__ == "__main__":
    main()
