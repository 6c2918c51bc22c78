"""coordl.WebDataset: tar shards made from an ImageFolder give that ImageFolder's batches (same
items, pixels, labels and order for one seed), through coordl.DataLoader's caches, counters,
workers, ranks and resume; the index is persisted; a batch's neighbours are one read; bad
shards and members are SampleErrors naming the shard and the key.

The mapping: the shards hold the ImageFolder's images in its manifest order, item i of the
shards (in the order the brace pattern gives them) is item i of the ImageFolder, as member
``<class>/<stem>.jpg`` with its label in ``<class>/<stem>.cls``.
"""

from __future__ import annotations

import gc
import io
import os
import tarfile
import warnings

import psutil
import pytest
import torch
from coordl_tests_loaderhelp import batches_of, epoch_counts

import coordl
from coordl.cache.storage import tarindex
from coordl.manifest.build import scan

PER_SHARD = 16


def write_shards(root: str, out_dir: str, per_shard: int = PER_SHARD, drop_label: int | None = None,
                 replace: dict[int, bytes] | None = None) -> tuple[str, list[str]]:
    """Tar the ImageFolder at `root` in manifest order into WebDataset shards; (brace pattern, paths).
    `drop_label`: an item written without its .cls; `replace`: items whose image bytes are these."""
    m = scan(root, manifest_cache="off")
    os.makedirs(out_dir, exist_ok=True)
    count = (len(m) + per_shard - 1) // per_shard
    paths = [os.path.join(out_dir, f"train-{s:06d}.tar") for s in range(count)]
    for s, path in enumerate(paths):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * per_shard, min(len(m), (s + 1) * per_shard)):
                key = os.path.splitext(os.path.relpath(m.path(i), m.root))[0]
                with open(m.path(i), "rb") as f:
                    image = (replace or {}).get(i, f.read())
                members = [(key + ".jpg", image)]
                if i != drop_label:
                    members.append((key + ".cls", str(int(m.labels[i])).encode()))
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return os.path.join(out_dir, f"train-{{000000..{count - 1:06d}}}.tar"), paths


@pytest.fixture
def shards(tiny_root, tmp_path):
    """(brace pattern, shard paths) of tiny_root: 40 items in 3 shards (16, 16, 8), of this test alone."""
    return write_shards(tiny_root, str(tmp_path / "shards"))




def test_brace_patterns_expand_as_webdataset(shards, tmp_path):
    pattern, paths = shards
    ds = coordl.WebDataset(pattern, transform="val", size=32)
    assert ds.shards == paths and len(ds) == 40
    assert coordl.WebDataset(paths, transform="val").shards == paths
    assert coordl.WebDataset(f"{paths[1]}::{paths[0]}", transform="val").shards == [paths[1], paths[0]]
    from coordl.datasets.webdataset import expand_urls
    assert expand_urls("s-{a,b}-{01..03}.tar") == [f"s-{c}-{k:02d}.tar" for c in "ab" for k in (1, 2, 3)]
    with pytest.raises(coordl.DatasetError, match=r"7 of 10 shards are not files \(first: '.*train-000003.tar'"):
        coordl.WebDataset(str(tmp_path / "shards" / "train-{000000..000009}.tar"))
    with pytest.raises(coordl.ConfigError, match="mix object-storage URLs"):  # buckets: tests/objstore
        coordl.WebDataset(["s3://bucket/train-0.tar", paths[0]])


@pytest.mark.parametrize("transform,workers", [("train", 0), ("val", 2)])
def test_batches_equal_the_imagefolder_of_the_same_jpegs(tiny_root, shards, transform, workers):
    folder = coordl.ImageFolder(tiny_root, transform=transform, size=48, seed=7)
    web = coordl.WebDataset(shards[0], transform=transform, size=48, seed=7)
    assert web.targets == folder.targets and len(web) == len(folder)
    assert web.index.key(0) == os.path.splitext(os.path.relpath(folder.samples[0][0], tiny_root))[0]
    a = coordl.DataLoader(web, batch_size=8, shuffle=True, num_workers=workers)
    b = coordl.DataLoader(folder, batch_size=8, shuffle=True, num_workers=workers)
    for _ in range(2):  # two epochs: each item once, same pixels, labels and order
        got, want = batches_of(a), batches_of(b)
        assert len(got) == len(want) == 5
        for (x, y), (u, v) in zip(got, want):
            assert torch.equal(x, u) and torch.equal(y, v)
        assert sorted(torch.cat([y for _, y in got]).tolist()) == sorted(folder.targets)
    stats = a.stats()
    assert stats["decodes"] == stats["samples"] == 80 and stats["errors_skipped"] == 0


def test_items_and_fetch_are_the_files_bytes(tiny_root, shards):
    folder = coordl.ImageFolder(tiny_root, transform="val", size=32)
    web = coordl.WebDataset(shards[0], transform="val", size=32)
    for i in (0, 17, 39):
        assert bytes(web.fetch(i)) == bytes(folder.fetch(i))
        assert web.read(i) == folder.read(i)  # the contract's uncounted read goes to the shard too
        x, y = web[i]
        u, v = folder[i]
        assert torch.equal(x, u) and y == v


def test_the_index_is_built_once_and_persisted(shards, tmp_path):
    before = dict(tarindex.BUILDS)
    folder = str(tmp_path / "indexes")
    a = coordl.WebDataset(shards[0], index_cache=folder)
    b = coordl.WebDataset(shards[0], index_cache=folder)
    assert tarindex.BUILDS["builds"] - before["builds"] == 1 and tarindex.BUILDS["loads"] - before["loads"] == 1
    assert a.fingerprint == b.fingerprint
    coordl.WebDataset(shards[0], index_cache=folder, reindex=True)
    coordl.WebDataset(shards[0], index_cache="off")
    assert tarindex.BUILDS["builds"] - before["builds"] == 3


def test_a_batch_of_neighbours_is_one_read_per_shard(shards):
    web = coordl.WebDataset(shards[0], transform="val", size=32)
    loader = coordl.DataLoader(web, batch_size=8, shuffle=False)  # batches 0-7, 8-15 | 16-23, 24-31 | 32-39
    stats = epoch_counts(loader)
    assert stats["storage_reads"] == 5 and stats["samples"] == 40
    sizes, offsets = web.index.size, web.index.offset
    expected = sum(int(offsets[k + 7] + sizes[k + 7] - offsets[k]) for k in range(0, 40, 8))
    assert stats["storage_bytes"] == expected
    straddling = coordl.DataLoader(web, batch_size=20, shuffle=False)  # 0-19 spans shards 0 and 1
    assert epoch_counts(straddling)["storage_reads"] == 2 + 2


def test_half_size_minio_cache_exact_hits_in_epoch_two(shards, dropped):
    web = coordl.WebDataset(shards[0], transform="val", size=32)
    dropped.append(web)
    n, total = len(web), web.index.total_bytes
    loader = coordl.DataLoader(web, batch_size=8, shuffle=True, num_workers=2, cache=total // 2)
    dropped.append(loader.dataset)
    first = epoch_counts(loader)
    assert first["cache_misses"] == n and first["cache_hits"] == 0
    state = loader.stats()
    items = state["cache_items"]
    assert 0 < state["cache_bytes"] <= total // 2 and first["cache_inserts"] == items
    for _ in range(2):
        later = epoch_counts(loader)
        assert later["cache_hits"] == items and later["cache_misses"] == n - items
        assert later["cache_inserts"] == 0 and later["samples"] == n
        assert 0 < later["storage_reads"] <= n - items
    assert loader.stats()["cache_items"] == items


def test_rank_shares_are_disjoint_and_cover(shards):
    web = coordl.WebDataset(shards[0], transform="val", size=32)
    seen = []
    for rank in (0, 1):
        loader = coordl.DataLoader(web, batch_size=4, shuffle=True, rank=rank, world_size=2)
        labels = [v for _, y in loader for v in y.tolist()]
        seen.append(loader.epoch_indices(0))
        assert labels == [web.targets[i] for i in seen[-1]]
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(40))


def test_resume_yields_the_remaining_batches(shards):
    def build():
        return coordl.DataLoader(coordl.WebDataset(shards[0], transform="train", size=32, seed=2), batch_size=8,
                                 shuffle=True)

    ref = batches_of(build())
    loader = build()
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    del it
    again = build()
    again.load_state_dict(state)
    rest = batches_of(again)
    assert len(rest) == 3
    for (x, y), (u, v) in zip(rest, ref[2:]):
        assert torch.equal(x, u) and torch.equal(y, v)


def test_a_missing_label_member_names_shard_and_key(tiny_root, tmp_path):
    pattern, paths = write_shards(tiny_root, str(tmp_path / "s"), drop_label=20)
    web = coordl.WebDataset(pattern, transform="val", size=32)
    key = web.index.key(20)
    with pytest.raises(coordl.SampleError, match=rf"train-000001\.tar: sample '{key}' has no label member"):
        epoch_counts(coordl.DataLoader(web, batch_size=8))
    skip = coordl.DataLoader(coordl.WebDataset(pattern, transform="val", size=32, on_error="skip"), batch_size=8)
    stats = epoch_counts(skip)
    assert stats["errors_skipped"] == 1 and stats["samples"] == 39


def test_a_corrupt_image_member_names_shard_and_key(tiny_root, tmp_path):
    pattern, _ = write_shards(tiny_root, str(tmp_path / "s"), replace={3: b"not a jpeg" * 50})
    web = coordl.WebDataset(pattern, transform="train", size=32)
    with pytest.raises(coordl.SampleError, match=rf"train-000000\.tar: sample '{web.index.key(3)}'"):
        epoch_counts(coordl.DataLoader(web, batch_size=8, num_workers=2))
    skip = coordl.WebDataset(pattern, transform="train", size=32, on_error="skip")
    stats = epoch_counts(coordl.DataLoader(skip, batch_size=8, num_workers=2))
    assert stats["errors_skipped"] == 1 and stats["samples"] == 39


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_error_shuts_the_workers_down_once_the_exception_is_dropped(tiny_root, tmp_path):
    """The SampleError a worker raised must not keep its iterator (and so the worker processes) alive
    through a reference cycle that only the garbage collector breaks (torch's ExceptionWrapper.reraise
    frame holds the exception; the frames below it the iterator): with the collector off, the workers
    are gone as soon as pytest.raises drops the exception. (Once a flake of the test above: workers
    still alive after no_leaks' wait, in a long run under load, until a collection happened.)"""
    pattern, _ = write_shards(tiny_root, str(tmp_path / "s"), replace={3: b"not a jpeg" * 50})
    loader = coordl.DataLoader(coordl.WebDataset(pattern, transform="train", size=32), batch_size=8,
                               num_workers=2)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(coordl.SampleError, match="train-000000.tar: sample"):
            for _ in loader:
                pass
        left = [p.pid for p in me.children(recursive=True) if p.pid not in before and _running(p)]
    finally:
        gc.enable()
    assert left == []


def test_a_truncated_shard_names_shard_and_key(shards):
    pattern, paths = shards
    index = tarindex.build_index([paths[2]])
    key, cut = index.key(5), int(index.offset[5]) + 100
    index.close()
    with open(paths[2], "r+b") as f:
        f.truncate(cut)
    with pytest.raises(coordl.SampleError, match=rf"train-000002\.tar: the shard is damaged: .*'{key}'"):
        coordl.WebDataset(pattern, transform="val", size=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        web = coordl.WebDataset(pattern, transform="val", size=32, on_error="skip")
    assert any("train-000002.tar" in str(w.message) for w in caught)
    assert web.damaged_shards == [paths[2]] and len(web) == 38   # samples 0-5 of the last shard
    stats = epoch_counts(coordl.DataLoader(web, batch_size=8))
    assert stats["errors_skipped"] == 1 and stats["samples"] == 37  # sample 5 ends past the cut
    got = web.read_many([30, 37])  # the contract's read_many: bytes, or the error naming shard and key
    assert isinstance(got[30], bytes) and isinstance(got[37], coordl.SampleError)
    assert "train-000002.tar" in str(got[37])
    with pytest.raises(coordl.SampleError, match=r"train-000002\.tar"):
        web.read(37)


def test_a_file_that_is_not_a_tar_names_the_shard(shards):
    pattern, paths = shards
    with open(paths[1], "wb") as f:
        f.write(b"garbage" * 1000)
    with pytest.raises(coordl.SampleError, match=r"train-000001\.tar: the shard is damaged: not a readable tar"):
        coordl.WebDataset(pattern)


def test_partitioned_cache_serves_epoch_two(shards, redis_nodes):
    node = redis_nodes()
    web = coordl.WebDataset(shards[0], transform="val", size=32)
    loader = coordl.DataLoader(web, batch_size=8, shuffle=True, num_workers=2,
                               cache=coordl.PartitionedCache([node.url], 0))
    first = epoch_counts(loader)
    assert first["samples"] == 40 and 0 < first["storage_reads"] <= 40
    second = epoch_counts(loader)
    assert second["storage_reads"] == 0 and second["samples"] == 40
    assert second["local_hits"] + second["remote_hits"] == 40


def _mgets(node) -> int:
    return int(node.client().info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


def test_partitioned_read_ahead_gives_the_same_batches_with_the_same_mgets(shards, redis_nodes):
    """As ImageFolder's (tests/cache/partitioned/test_partitioned_ahead.py): with the cache's read_ahead on, each
    worker's next batch's MGETs go out while it prepares this one, and are read, not sent again;
    the batches and the MGETs per node and epoch are those with it off."""
    nodes = [redis_nodes() for _ in range(3)]
    urls = [n.url for n in nodes]
    runs: dict[bool, list] = {}
    for ahead in (False, True):
        web = coordl.WebDataset(shards[0], transform="train", size=32, seed=4)
        cache = coordl.PartitionedCache(urls, 1, read_ahead=ahead)
        loader = coordl.DataLoader(web, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                                   cache=cache)
        got = []
        for epoch in range(3):
            before = [_mgets(n) for n in nodes]
            got.append(batches_of(loader))
            if epoch:  # every item cached: MGETs only
                got[-1].append([_mgets(n) - b for n, b in zip(nodes, before)])
        st = loader.stats()
        del loader
        assert st["remote_errors"] == 0 and st["samples"] == 3 * 40
        # off (first): epochs 2 and 3 from the nodes; on: all three (the off run filled them)
        assert st["local_hits"] + st["remote_hits"] == (3 if ahead else 2) * 40
        # on: every batch but each worker's first of an epoch was sent ahead (10 batches, 2 workers)
        assert st["ahead_hits"] == (3 * (40 - 2 * 4) if ahead else 0), st
        runs[ahead] = got
        cache.close()
    for off, on in zip(runs[False], runs[True]):
        assert len(off) == len(on)
        for (xo, yo), (xa, ya) in zip(off[:10], on[:10]):
            assert xo.equal(xa) and yo.equal(ya)
    assert runs[False][1][-1] == runs[True][1][-1] and runs[False][2][-1] == runs[True][2][-1]


def test_device_prep_gives_imagefolders_device_batches_from_shards(tiny_root, shards):
    """DataLoader(device="cpu"): the shards' bytes and plans go through WebDataset's own fetch
    (coalesced tar reads) and give the very batches ImageFolder's files give on the same path."""
    web = coordl.DataLoader(coordl.WebDataset(shards[0], transform="train", size=48, seed=7), batch_size=8,
                            shuffle=True, num_workers=1, device="cpu", decoder="cpu")
    folder = coordl.DataLoader(coordl.ImageFolder(tiny_root, transform="train", size=48, seed=7), batch_size=8,
                               shuffle=True, num_workers=1, device="cpu", decoder="cpu")
    got, want = batches_of(web), batches_of(folder)
    assert len(got) == len(want) == 5
    for (x, y), (u, v) in zip(got, want):
        assert torch.equal(x, u) and torch.equal(y, v)
    stats = web.stats()
    assert stats["gpu_decodes"] + stats["gpu_cpu_fallbacks"] == stats["samples"] == 40
    assert stats["storage_reads"] < 40  # neighbouring tar members read together
