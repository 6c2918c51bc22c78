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
                          "--server", server], capture_output=True, text=True, timeout=300, cwd=REPO)
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

    from coordl.cache.objstore import ObjectStore

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
        assert proxy.routes == {"static": len(calls) + 1, "moto": 0}
        assert _answer(via.get_object, Bucket="data", Key="train/missing.jpg")[:2] == (404, "NoSuchKey")
        listed = [o["Key"] for o in via.list_objects_v2(Bucket="data", Prefix="train/")["Contents"]]
        assert listed == [f"train/{k}" for k in s3.keys]
        assert proxy.routes == {"static": len(calls) + 1, "moto": 2}

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
