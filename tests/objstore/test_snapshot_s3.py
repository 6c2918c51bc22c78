"""A loader serves one snapshot of a bucket (the module's real moto server): an object rewritten
between two epochs is, without a cache, a SampleError saying it changed (or a counted skip), never
its new bytes; with a MinIO cache, the bytes listed (cached); the same at 0 and 2 workers and with
both clients (each GET sends If-Match with the listed ETag). Keys with an empty, '.' or '..'
segment are listed and read alike by both clients."""

from __future__ import annotations

import gc
import io
import os
import sys

import pytest
import torch
from PIL import Image

import coordl
from coordl.cache.storage.objstore import ObjectStore
from coordl.errors import SampleError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import BUCKET  # noqa: E402

pytest.importorskip("obstore")

CLIENTS = ("s3fs", "obstore")


def _jpeg(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (shade, 255 - shade, 7)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture
def snap(s3, request):
    """(its URL, its keys): 8 JPEGs in 2 classes under a prefix of this test's own."""
    prefix = f"snap/{request.node.name.replace('[', '-').rstrip(']')}"
    client = s3.server.client()
    keys = [f"class_{c}/img_{j}.jpg" for c in range(2) for j in range(4)]
    for n, key in enumerate(keys):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=_jpeg(20 * n))
    yield f"s3://{BUCKET}/{prefix}", keys
    for key in keys:
        client.delete_object(Bucket=BUCKET, Key=f"{prefix}/{key}")


def _loader(ds, workers: int, client: str, **kw):
    """A DataLoader whose workers GET through `client`: obstore's runtime does not survive fork, and
    this test process may have started it, so obstore workers are started by forkserver, once."""
    if workers and client == "obstore":
        kw.update(multiprocessing_context="forkserver", persistent_workers=True)
    return coordl.DataLoader(ds, batch_size=4, num_workers=workers, **kw)


def _run(loader) -> list:
    return [(x.clone(), y.clone()) for x, y in loader]


def _rewrite(s3, url: str, key: str) -> None:
    s3.server.client().put_object(Bucket=BUCKET, Key=f"{url.split('/', 3)[3]}/{key}", Body=_jpeg(250))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("client", CLIENTS)
def test_an_object_rewritten_between_epochs_is_a_sample_error_not_its_new_bytes(s3, snap, client, workers):
    url, keys = snap
    ds = coordl.ImageFolder(url, transform="val", size=16, storage_options=s3.options(), manifest_cache="off",
                            fetch_client=client)
    loader = _loader(ds, workers, client)
    assert len(_run(loader)) == 2
    _rewrite(s3, url, keys[5])
    with pytest.raises(SampleError, match=rf"{url}/{keys[5]}: changed since it was listed"):
        _run(loader)
    del loader
    gc.collect()


# obstore's GET path is the same at any worker count (the first test runs it in forkserver workers)
@pytest.mark.parametrize(("client", "workers"), [("s3fs", 0), ("s3fs", 2), ("obstore", 0)])
def test_with_on_error_skip_the_rewritten_object_is_a_counted_skip(s3, snap, client, workers):
    url, keys = snap
    ds = coordl.ImageFolder(url, transform="val", size=16, storage_options=s3.options(), manifest_cache="off",
                            fetch_client=client, on_error="skip")
    loader = _loader(ds, workers, client)
    first = _run(loader)
    _rewrite(s3, url, keys[2])
    second = _run(loader)
    assert loader.stats()["errors_skipped"] == 1
    labels = torch.cat([y for _, y in second])
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    kept = torch.cat([x for x, _ in first])[[0, 1, 3, 4, 5, 6, 7]]
    assert torch.equal(torch.cat([x for x, _ in second]), kept)  # the others: their listed bytes


@pytest.mark.parametrize(("client", "workers"), [("s3fs", 0), ("s3fs", 2), ("obstore", 0)])
def test_with_a_minio_cache_the_listed_bytes_are_served(s3, snap, client, workers, dropped):
    url, keys = snap
    ds = coordl.ImageFolder(url, transform="val", size=16, storage_options=s3.options(), manifest_cache="off",
                            fetch_client=client)
    loader = _loader(ds, workers, client, cache=4 << 20)
    dropped.append(loader.dataset)
    first = _run(loader)
    _rewrite(s3, url, keys[5])
    second = _run(loader)
    assert all(torch.equal(a, b) and torch.equal(y, v) for (a, y), (b, v) in zip(first, second))
    assert loader.stats()["cache_hits"] == len(keys)


@pytest.mark.parametrize("client", CLIENTS)
def test_ranged_reads_check_the_listed_etag(s3, snap, client):
    url, keys = snap
    with ObjectStore.from_url(url, s3.options(), fetch_client=client) as store:
        listed = {o.key: o.etag for o in store.list()}
        assert store.read_ranges([(keys[0], 0, 4)], etags=[listed[keys[0]]]) == [_jpeg(0)[:4]]
        _rewrite(s3, url, keys[0])
        got = store.read_ranges([(keys[0], 0, 4), (keys[1], 0, 4)], return_errors=True,
                                etags=[listed[keys[0]], listed[keys[1]]])
        assert isinstance(got[0], SampleError) and "changed since it was listed" in str(got[0])
        assert got[1] == _jpeg(20)[:4]
        (future,) = store.submit_many([keys[0]], etags=[listed[keys[0]]])
        with pytest.raises(SampleError, match="changed since it was listed"):
            future.result()


ODD = ["class_0/a.jpg", "class_0/./b.jpg", "class_0/../c.jpg", "class_0/d//e.jpg", "class_1/f.jpg"]


def test_keys_with_dot_and_empty_segments_are_listed_and_read_alike_by_both_clients(s3, request):
    prefix = "odd-keys"
    client = s3.server.client()
    for n, key in enumerate(ODD):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=_jpeg(30 * n))
    try:
        seen = {}
        for fetch in CLIENTS:
            ds = coordl.ImageFolder(f"s3://{BUCKET}/{prefix}", transform="val", size=16, manifest_cache="off",
                                    storage_options=s3.options(), fetch_client=fetch)
            assert ds.objects.store.fetch_client == fetch
            m = ds.manifest
            batches = _run(coordl.DataLoader(ds, batch_size=8, num_workers=0))
            seen[fetch] = ([m.relpath(i) for i in range(len(m))], batches[0][1].tolist(), batches[0][0])
        names, labels, images = seen["obstore"]
        assert sorted(names) == sorted(ODD) and labels == [0, 0, 0, 0, 1]
        assert names == seen["s3fs"][0] and labels == seen["s3fs"][1] and torch.equal(images, seen["s3fs"][2])
    finally:
        for key in ODD:
            client.delete_object(Bucket=BUCKET, Key=f"{prefix}/{key}")
