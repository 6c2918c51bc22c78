"""coordl.WebDataset over shards in a bucket (a real moto server of this module, the shards made from
real JPEGs by tests/coordl/datasets/test_webdataset.py's write_shards): each sample once per epoch with
the local shards' pixels and labels; the index built once from the tar headers and reused while the
shards' (URL, size, ETag) hold; items read by ranged GETs, a batch's neighbours in one shard by ONE
GET; a half-size MinIO cache saves exactly the GETs it holds; a deleted or corrupt shard is a
SampleError naming the shard's URL and the key. Counts (store stats, the proxy's GETs), not clocks."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys

import pytest
import torch

import coordl
from coordl.cache.storage import tarindex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coordl_tests_loaderhelp import batches_of, epoch_counts
from objstore_common import TESTS, objstore_proxy, s3server  # noqa: E402

BUCKET, PREFIX = "shards", "wds"
N = 40  # tiny_root's items: 3 shards of 16, 16, 8


def _write_shards():
    path = os.path.join(TESTS, "coordl", "datasets", "test_webdataset.py")
    spec = importlib.util.spec_from_file_location("coordl_tests_webdataset_shards", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_shards


write_shards = _write_shards()


class Shards:
    def __init__(self, server, local: list[str], pattern: str) -> None:
        self.server, self.local, self.pattern = server, local, pattern
        self.url = f"s3://{BUCKET}/{PREFIX}/train-{{000000..{len(local) - 1:06d}}}.tar"

    def options(self, **changes) -> dict:
        return {**self.server.options(), **changes}

    def put(self, name: str, data: bytes, prefix: str = PREFIX) -> None:
        self.server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=data)

    def restore(self, k: int) -> None:
        with open(self.local[k], "rb") as f:
            self.put(os.path.basename(self.local[k]), f.read())


@pytest.fixture(scope="module")
def shards(moto_server, tiny_root, tmp_path_factory) -> Shards:
    """tiny_root as 3 shards in s3://shards/wds/ on this module's moto server (conftest.py)."""
    pattern, paths = write_shards(tiny_root, str(tmp_path_factory.mktemp("wds-local")))
    moto_server.client().create_bucket(Bucket=BUCKET)
    out = Shards(moto_server, paths, pattern)
    for k in range(len(paths)):
        out.restore(k)
    return out


@pytest.fixture
def proxy(shards):
    p = objstore_proxy.FaultProxy(shards.server.url, latency=0.0).start()
    yield p
    p.stop()




@pytest.mark.parametrize("workers", [0, 2])
def test_each_sample_once_with_the_local_shards_pixels_and_labels(shards, tmp_path, workers):
    remote = coordl.WebDataset(shards.url, transform="train", size=40, seed=3, storage_options=shards.options(),
                               index_cache=str(tmp_path))
    local = coordl.WebDataset(shards.pattern, transform="train", size=40, seed=3, index_cache="off")
    assert remote.shards == [f"s3://{BUCKET}/{PREFIX}/train-{k:06d}.tar" for k in range(3)]
    assert len(remote) == N and remote.targets == local.targets
    assert s3server.TEST_SECRET not in repr(remote) + str(remote.shards) + repr(remote.object_store)
    a = coordl.DataLoader(remote, batch_size=8, shuffle=True, num_workers=workers)
    b = coordl.DataLoader(local, batch_size=8, shuffle=True, num_workers=workers)
    for _ in range(2):
        got, want = batches_of(a), batches_of(b)
        assert len(got) == len(want) == 5
        for (x, y), (u, v) in zip(got, want):
            assert torch.equal(x, u) and torch.equal(y, v)
        assert sorted(torch.cat([y for _, y in got]).tolist()) == sorted(local.targets)
    for i in (0, 17, 39):
        assert bytes(remote.fetch(i)) == bytes(local.fetch(i))


def test_the_index_is_built_once_from_the_headers_and_reused(shards, tmp_path, monkeypatch):
    folder = str(tmp_path / "indexes")
    before = dict(tarindex.BUILDS)
    first = coordl.WebDataset(shards.url, storage_options=shards.options(), index_cache=folder)
    assert first.object_store.stats()["gets"] == 3  # shards under WHOLE_SHARD: one GET each
    again = coordl.WebDataset(shards.url, storage_options=shards.options(), index_cache=folder)
    assert again.object_store.stats()["gets"] == 0  # a listing (sizes, ETags) and the persisted index
    assert tarindex.BUILDS["builds"] - before["builds"] == 1 and tarindex.BUILDS["loads"] - before["loads"] == 1
    assert again.fingerprint == first.fingerprint

    # shards over WHOLE_SHARD: headers walked by ranged GETs of READ_AHEAD bytes; the same index
    monkeypatch.setattr(tarindex, "WHOLE_SHARD", 0)
    monkeypatch.setattr(tarindex, "READ_AHEAD", 2048)
    ranged = coordl.WebDataset(shards.url, storage_options=shards.options(), index_cache="off")
    for name in ("shard", "offset", "size", "label", "label_state", "keys"):
        assert (getattr(ranged.index, name) == getattr(first.index, name)).all()
    gets = ranged.object_store.stats()["gets"]
    assert 3 < gets < 2 * N  # some headers came with the previous GET (2 members per sample)

    # a shard rewritten (new ETag): rebuilt
    shards.put("train-000002.tar", open(shards.local[2], "rb").read() + b"\0" * 1024)
    try:
        coordl.WebDataset(shards.url, storage_options=shards.options(), index_cache=folder)
        assert tarindex.BUILDS["builds"] - before["builds"] == 3
    finally:
        shards.restore(2)


def test_a_batch_of_neighbours_is_one_ranged_get_per_shard(shards, proxy):
    web = coordl.WebDataset(shards.url, transform="val", size=32,
                            storage_options=shards.options(endpoint_url=proxy.url), index_cache="off")
    loader = coordl.DataLoader(web, batch_size=8, shuffle=False)  # 0-7, 8-15 | 16-23, 24-31 | 32-39
    store = web.object_store
    gets = store.stats()["gets"]
    proxy.reset_counts()
    stats = epoch_counts(loader)
    assert stats["samples"] == N and stats["storage_reads"] == 5
    assert store.stats()["gets"] - gets == proxy.counts["GET"] == 5  # 40 items, 5 GETs
    sizes, offsets = web.index.size, web.index.offset
    assert stats["storage_bytes"] == sum(int(offsets[k + 7] + sizes[k + 7] - offsets[k]) for k in range(0, N, 8))

    apart = coordl.WebDataset(shards.url, transform="val", size=32, max_gap=0,  # no coalescing: a GET per item
                              storage_options=shards.options(endpoint_url=proxy.url), index_cache="off")
    proxy.reset_counts()
    stats = epoch_counts(coordl.DataLoader(apart, batch_size=8, shuffle=False))
    assert stats["storage_reads"] == proxy.counts["GET"] == N
    assert stats["storage_bytes"] == web.index.total_bytes


def test_half_size_minio_cache_saves_exactly_the_gets_it_holds(shards, proxy, dropped, tmp_path):
    web = coordl.WebDataset(shards.url, transform="val", size=32, max_gap=0,  # a GET per miss
                            storage_options=shards.options(endpoint_url=proxy.url), index_cache=str(tmp_path))
    loader = coordl.DataLoader(web, batch_size=8, shuffle=True, num_workers=2, cache=web.index.total_bytes // 2)
    dropped.append(loader.dataset)
    proxy.reset_counts()
    first = epoch_counts(loader)
    assert proxy.counts["GET"] == first["storage_reads"] == N
    held = first["cache_inserts"]
    assert 0 < held < N
    for _ in range(2):
        proxy.reset_counts()
        later = epoch_counts(loader)
        assert later["cache_hits"] == held and later["cache_misses"] == N - held and later["samples"] == N
        assert later["storage_reads"] == proxy.counts["GET"] == N - held


def test_a_deleted_shard_names_its_url_and_the_key(shards, tmp_path):
    opts = shards.options()
    strict = coordl.WebDataset(shards.url, transform="val", size=32, storage_options=opts, index_cache=str(tmp_path))
    lenient = coordl.WebDataset(shards.url, transform="val", size=32, storage_options=opts, index_cache=str(tmp_path),
                                on_error="skip")
    shards.server.client().delete_object(Bucket=BUCKET, Key=f"{PREFIX}/train-000001.tar")
    try:
        key = strict.index.key(16)
        with pytest.raises(coordl.SampleError, match=rf"s3://{BUCKET}/{PREFIX}/train-000001\.tar: sample '{key}': "
                                                     r"GET failed .*deleted") as caught:
            batches_of(coordl.DataLoader(strict, batch_size=8, num_workers=2))
        assert s3server.TEST_SECRET not in str(caught.value)
        del caught
        gc.collect()  # the failed loader's workers end with it
        counts = epoch_counts(coordl.DataLoader(lenient, batch_size=8, num_workers=2))
        assert (counts["errors_skipped"], counts["samples"]) == (16, N - 16)
        with pytest.raises(coordl.DatasetError, match=rf"1 of 3 shards are not in the store \(first: "
                                                      rf"'s3://{BUCKET}/{PREFIX}/train-000001\.tar'"):
            coordl.WebDataset(shards.url, storage_options=opts, index_cache="off")
    finally:
        shards.restore(1)


def test_a_corrupt_shard_names_its_url(shards):
    opts = shards.options()
    shards.put("train-000000.tar", b"garbage" * 1000, prefix="bad")
    with open(shards.local[1], "rb") as f:
        shards.put("train-000001.tar", f.read()[:5000], prefix="bad")  # torn inside a member
    url = f"s3://{BUCKET}/bad/train-000000.tar"
    with pytest.raises(coordl.SampleError, match=rf"{url}: the shard is damaged: not a readable tar"):
        coordl.WebDataset(url, storage_options=opts, index_cache="off")
    torn = f"s3://{BUCKET}/bad/train-000001.tar"
    with pytest.warns(UserWarning, match=torn):
        web = coordl.WebDataset(torn, transform="val", size=32, storage_options=opts, index_cache="off",
                                on_error="skip")
    assert web.damaged_shards == [torn]


def test_read_ranges_keeps_the_bound_retries_and_names_the_url(shards, proxy):
    from coordl.cache.storage.objstore import ObjectStore

    store = ObjectStore.from_url(f"s3://{BUCKET}/{PREFIX}", shards.options(endpoint_url=proxy.url), max_in_flight=3)
    try:
        with open(shards.local[0], "rb") as f:
            local = f.read()
        ranges = [("train-000000.tar", off, 700) for off in range(0, 40 * 512, 512)]
        proxy.latency, proxy.max_in_flight = 0.02, 0
        proxy.inject(503, 2)
        got = store.read_ranges(ranges)
        assert got == [local[off:off + 700] for _, off, _ in ranges]
        assert proxy.max_in_flight <= 3
        stats = store.stats()
        assert stats["retries"] == 2 and stats["gets"] == 40 + 2 and stats["bytes"] == 40 * 700
        assert store.read_ranges([("train-000000.tar", len(local) - 10, 100)]) == [local[-10:]]  # short at the end
        (missing,) = store.read_ranges([("nope.tar", 0, 10)], return_errors=True)
        assert isinstance(missing, coordl.SampleError)
        assert str(missing).startswith(f"s3://{BUCKET}/{PREFIX}/nope.tar: GET failed")
        with pytest.raises(coordl.SampleError, match=rf"s3://{BUCKET}/{PREFIX}/nope\.tar: GET failed"):
            store.read_ranges([("train-000000.tar", 0, 10), ("nope.tar", 0, 10)])
    finally:
        store.close()


def test_a_store_without_etags_is_indexed_at_every_start(shards, tmp_path):
    """memory:// lists no ETag: a size alone cannot tell a rewritten shard, so nothing is persisted."""
    import fsspec

    fs = fsspec.filesystem("memory")
    with open(shards.local[2], "rb") as f:
        fs.pipe("/wds-noetag/train-000002.tar", f.read())
    try:
        before = dict(tarindex.BUILDS)
        for _ in range(2):
            web = coordl.WebDataset("memory://wds-noetag/train-000002.tar", transform="val", size=32,
                                    index_cache=str(tmp_path))
        assert tarindex.BUILDS["builds"] - before["builds"] == 2 and tarindex.BUILDS["loads"] == before["loads"]
        assert os.listdir(tmp_path) == [] and len(web) == 8
        local = coordl.WebDataset(shards.local[2], transform="val", size=32, index_cache="off")
        assert web.targets == local.targets and bytes(web.fetch(7)) == bytes(local.fetch(7))
    finally:
        fs.rm("/wds-noetag", recursive=True)


@pytest.mark.parametrize("client", ["s3fs", "obstore"])
def test_fetch_client_reaches_the_shards_store(shards, tmp_path, client, monkeypatch):
    pytest.importorskip("obstore")
    monkeypatch.delenv("COORDL_S3_CLIENT", raising=False)
    remote = coordl.WebDataset(shards.url, transform="val", size=32, storage_options=shards.options(),
                               index_cache=str(tmp_path), fetch_client=client)
    local = coordl.WebDataset(shards.pattern, transform="val", size=32, index_cache="off")
    assert remote.object_store.fetch_client == client
    assert [bytes(remote.fetch(i)) for i in (0, 17, 39)] == [bytes(local.fetch(i)) for i in (0, 17, 39)]
