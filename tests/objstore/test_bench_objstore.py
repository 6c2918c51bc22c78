"""bench/objstore.py still runs, on a handful of images: both readers fetch every object (counted at the proxy)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_objstore_runs_on_a_few_images():
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "objstore.py"), "--images", "8", "--classes", "2",
                          "--size", "96x72", "--latency", "0.005", "--batch", "4"],
                         capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "coordl read_many" in out.stdout and "8 GETs" in out.stdout and "ratio:" in out.stdout


@pytest.mark.parametrize("server", ["static", "moto"])
def test_bench_objstore_loaders_run_on_a_few_images(server):
    """--loaders: the S3 loaders each GET every object every epoch (counted at the proxy), and the
    half-size MinIO cache GETs fewer than all in its later epochs, the same number in each; with
    --server static no request of an epoch reaches moto, with --server moto every one does."""
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "objstore.py"), "--loaders", "--images", "12",
                          "--classes", "2", "--size", "96x72", "--latency", "0.005", "--batch", "4", "--epochs", "2",
                          "--server", server, "--pairs", "2"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {line.split("  ")[1].strip(): line for line in out.stdout.splitlines()[1:5]}

    def listed(line: str, what: str) -> list[int]:
        return [int(v) for v in line.split(what + " [")[1].split("]")[0].split(", ")]

    assert listed(lines["coordl s3"], "GETs per epoch") == [12, 12, 12]
    assert listed(lines["coordl local"], "GETs per epoch") == [0, 0, 0]
    assert listed(lines["torch s3fs"], "GETs per epoch") == [12, 12, 12]  # + a HEAD each (s3fs's open)
    gets = listed(lines["coordl s3 MinIO f=0.5"], "GETs per epoch")
    assert gets[0] == 12 and gets[1] == gets[2] and 0 < gets[1] < 12
    to_moto = {name: listed(line, "requests to moto") for name, line in lines.items()}
    if server == "static":
        assert all(v == [0, 0, 0] for v in to_moto.values())
    else:
        assert to_moto["coordl s3"] == [12, 12, 12] and to_moto["torch s3fs"] == [24, 24, 24]
    assert "CPU s/epoch: loader" in lines["coordl s3"] and "ratios: s3 / local" in out.stdout
    assert "interleaved pairs" in out.stdout and "2 pairs after a warm-up" in out.stdout


def _static():
    from objstore_common import BENCH, _load
    return _load("coordl_bench_objstore_static", os.path.join(BENCH, "lib", "objstore_static.py"))


def _answer(call, **kw):
    """(status, body, the headers botocore parsed that S3 defines) of a boto3 call, or of its error."""
    import botocore.exceptions
    try:
        r = call(**kw)
    except botocore.exceptions.ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"], None
    body = r["Body"].read() if "Body" in r else b""
    fields = ("ETag", "ContentLength", "ContentRange", "LastModified", "ContentType", "AcceptRanges", "ChecksumCRC32")
    return r["ResponseMetadata"]["HTTPStatusCode"], body, {k: r.get(k) for k in fields}


def test_static_route_answers_object_reads_as_moto_does(s3):
    """bench/lib/objstore_static.py: GETs (whole, every Range form, past the end, If-Match) and HEADs
    through it match moto's own answers field by field; listings and missing keys go to moto; the
    routes are counted exactly; s3fs and coordl read every object's bytes through it."""
    import boto3

    from coordl.cache.storage.objstore import ObjectStore

    static = _static()
    direct = s3.server.client()
    index = static.build_index(direct, "data", "train", s3.root)
    assert len(index) == len(s3.keys)
    proxy = static.StaticProxyProcess(s3.server.url, index, latency=0.0).start()
    try:
        via = boto3.client("s3", endpoint_url=proxy.url, aws_access_key_id="k", aws_secret_access_key="s",
                           region_name="us-east-1")
        key = f"train/{s3.keys[5]}"
        size = len(s3.local_bytes(s3.keys[5]))
        calls = [{}, {"Range": "bytes=2-40"}, {"Range": "bytes=-7"}, {"Range": f"bytes=10-{size * 2}"},
                 {"Range": f"bytes={size - 1}-"}, {"Range": f"bytes={size}-"}, {"IfMatch": '"nope"'},
                 {"IfMatch": index["/data/" + key]["etag"]}, {"ChecksumMode": "ENABLED"}]
        for kw in calls:
            got = _answer(via.get_object, Bucket="data", Key=key, **kw)
            assert got == _answer(direct.get_object, Bucket="data", Key=key, **kw), kw
        assert _answer(via.head_object, Bucket="data", Key=key) == _answer(direct.head_object, Bucket="data", Key=key)
        assert proxy.routes == {"static": len(calls) + 1, "moto": 0, "listing": 0}
        assert _answer(via.get_object, Bucket="data", Key="train/missing.jpg")[:2] == (404, "NoSuchKey")
        listed = [o["Key"] for o in via.list_objects_v2(Bucket="data", Prefix="train/")["Contents"]]
        assert listed == [f"train/{k}" for k in s3.keys]
        assert proxy.routes == {"static": len(calls) + 1, "moto": 2, "listing": 0}

        proxy.reset_counts()
        store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url), max_in_flight=8)
        assert store.read_many(s3.keys) == [s3.local_bytes(k) for k in s3.keys]
        store.close()
        import s3fs
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options(endpoint_url=proxy.url))
        with fs.open(f"data/train/{s3.keys[0]}", "rb") as f:
            assert f.read() == s3.local_bytes(s3.keys[0])
        assert proxy.routes["static"] == len(s3.keys) + 2  # s3fs: a HEAD, then a GET
        assert proxy.counts["HEAD"] == 1 and proxy.counts["GET"] == proxy.routes["static"] - 1 + proxy.routes["moto"]
    finally:
        proxy.stop()


def _pages(client, **kw) -> list[tuple]:
    """Every page of a ListObjectsV2 (following NextContinuationToken): (KeyCount, IsTruncated, keys,
    common prefixes) each."""
    out, token = [], None
    while True:
        r = client.list_objects_v2(Bucket="bench", **kw, **({"ContinuationToken": token} if token else {}))
        out.append((r["KeyCount"], r["IsTruncated"], [o["Key"] for o in r.get("Contents", [])],
                    [p["Prefix"] for p in r.get("CommonPrefixes", [])]))
        if not r["IsTruncated"]:
            return out
        token = r["NextContinuationToken"]


def test_synthetic_listing_pages_as_moto_does(moto_server):
    """bench/lib/objstore_listing.py behind objstore_static (no moto): ListObjectsV2 with and without a
    delimiter, small MaxKeys, StartAfter and prefixes that match nothing pages exactly as moto does
    over the same keys; each entry carries the bucket's ETag and size; HeadBucket and HeadObject
    answer from it (404 for what it does not hold); anything else is 501 and never reaches a moto."""
    import boto3
    import botocore.exceptions
    from objstore_common import BENCH, _load

    listing = _load("coordl_bench_objstore_listing", os.path.join(BENCH, "lib", "objstore_listing.py"))
    keys = listing.synthetic_keys(40, 3)
    direct = moto_server.client()
    direct.create_bucket(Bucket="bench")
    for k in keys:
        direct.put_object(Bucket="bench", Key=k, Body=b"")
    proxy = _static().StaticProxyProcess(None, {}, latency=0.0, listing=(40, 3)).start()
    try:
        via = boto3.client("s3", endpoint_url=proxy.url, aws_access_key_id="k", aws_secret_access_key="s",
                           region_name="us-east-1")
        cls = keys[0].split("/")[1]
        for kw in ({"Prefix": "train/"}, {"Prefix": "train/", "Delimiter": "/"}, {"Prefix": "train/", "MaxKeys": 7},
                   {"Prefix": "train/", "Delimiter": "/", "MaxKeys": 2}, {"Delimiter": "/"}, {},
                   {"Prefix": f"train/{cls}/", "StartAfter": keys[5], "MaxKeys": 4}, {"Prefix": "train/x"},
                   {"Prefix": f"train/{cls}"}, {"Prefix": "train/", "Delimiter": "_", "MaxKeys": 1}):
            assert _pages(via, **kw) == _pages(direct, **kw), kw
        entry = via.list_objects_v2(Bucket="bench", Prefix="train/", MaxKeys=1)["Contents"][0]
        assert (entry["ETag"], entry["Size"]) == (listing.SyntheticBucket.etag(keys[0]),
                                                  listing.SyntheticBucket.size(keys[0]))
        assert via.head_bucket(Bucket="bench")["ResponseMetadata"]["HTTPStatusCode"] == 200
        head = via.head_object(Bucket="bench", Key=keys[3])
        assert (head["ETag"], head["ContentLength"]) == (listing.SyntheticBucket.etag(keys[3]),
                                                         listing.SyntheticBucket.size(keys[3]))
        for call, kw in ((via.head_object, {"Bucket": "bench", "Key": "train/missing.JPEG"}),
                         (via.head_bucket, {"Bucket": "other"}), (via.get_object, {"Bucket": "bench", "Key": keys[0]})):
            with pytest.raises(botocore.exceptions.ClientError) as e:
                call(**kw)
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == (501 if call == via.get_object else 404)
        assert proxy.routes["moto"] == 1 and proxy.routes["static"] == 0  # the GET: 501, no moto behind it
    finally:
        proxy.stop()


@pytest.mark.parametrize("server, n, lists", [("static", 3001, 1 + 2 + 1 + 1), ("moto", 300, 1 + 1 + 1 + 1)])
def test_bench_objstore_listing_runs(server, n, lists):
    """--listing N over 3 classes: every run (one at a time without and with latency, parallel) sends
    exactly the pages of each class prefix (3001: 1001 + 1000 + 1000 keys) + the root's listing once,
    and the bench checked every key, class, target (and, static, size) of the dataset."""
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "objstore.py"), "--listing", str(n), "--classes",
                          "3", "--latency", "0.002", "--in-flight", "8", "--server", server],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = [line for line in out.stdout.splitlines() if "LIST requests" in line]
    want = f", {lists} LIST requests (0 listing calls retried), "
    assert len(runs) == 3 and all(want in line for line in runs), out.stdout
    assert "at most 1 at once" in runs[0] and "at most 1 at once" in runs[1] and "model, 1,281,000" in out.stdout


def test_bench_objstore_webdataset_loaders_run_on_a_few_images():
    """--loaders --webdataset: read_ahead off and on each read every image once per epoch, with the same
    coalesced ranged GETs (max_gap: neighbours in a shard, one GET) counted at the proxy."""
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "objstore.py"), "--loaders", "--webdataset",
                          "--images", "12", "--per-shard", "4", "--classes", "2", "--size", "96x72", "--latency",
                          "0.005", "--batch", "4", "--epochs", "1"], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 images in 3 shards" in out.stdout and "read_ahead on / off:" in out.stdout
    gets = {flag: [int(v) for v in out.stdout.split(f"read_ahead={flag} ")[1].split("GETs per epoch [")[1]
                   .split("]")[0].split(", ")] for flag in ("False", "True")}
    assert all(0 < g <= 12 for g in gets["False"] + gets["True"]), out.stdout
