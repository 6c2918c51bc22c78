"""coordl.DataLoader(cache=...): exact byte counts per epoch, sharing between processes, lifetime."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from coordl_tests_loaderhelp import epoch_counts

import coordl
from coordl.cache import shm
from coordl.cache.minio import admin
from coordl.cache.minio.layout import data_offset
from coordl.datasets.caching import parse_size


@pytest.fixture
def own_root(tiny_root, tmp_path):
    """A copy of tiny_root with fresh mtimes: a dataset (fingerprint, cache) of this test alone."""
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    return root




def _read(ds, i) -> bytes:
    with open(ds.manifest.path(i), "rb") as f:
        return f.read()


def test_counting_half_capacity_three_shuffled_epochs_two_workers(own_root, dropped):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    dropped.append(ds)
    n, total = len(ds), ds.manifest.total_bytes
    capacity = total // 2
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, cache=capacity)
    dropped.append(loader.dataset)
    assert loader.dataset.drop_page_cache is True and ds.cache is None

    first = epoch_counts(loader)
    assert first["storage_reads"] == n and first["storage_bytes"] == total
    assert first["cache_misses"] == n and first["cache_hits"] == 0
    state = loader.stats()
    cached, items = state["cache_bytes"], state["cache_items"]
    assert 0 < cached <= capacity and state["cache_capacity"] == capacity
    assert first["cache_inserts"] == items
    for _ in range(2):
        later = epoch_counts(loader)
        assert later["storage_bytes"] == total - cached
        assert later["storage_reads"] == n - items
        assert later["cache_hits"] == items and later["cache_inserts"] == 0
    assert loader.stats()["cache_bytes"] == cached            # never evicted, never replaced
    for i in range(n):
        assert bytes(ds.fetch(i)) == _read(ds, i)


def test_spawned_workers_reattach_by_name(own_root, dropped):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    dropped.append(ds)
    loader = coordl.DataLoader(ds, batch_size=10, num_workers=2, cache="1MiB",
                               multiprocessing_context="spawn")
    first, second = epoch_counts(loader), epoch_counts(loader)
    assert first["cache_inserts"] == len(ds) == second["cache_hits"]   # workers wrote, workers read
    assert second["storage_reads"] == 0


_JOB = textwrap.dedent("""
    import json, sys
    import coordl
    ds = coordl.ImageFolder(sys.argv[1], transform="val", size=32)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, cache=int(sys.argv[2]))
    for _ in loader:
        pass
    name = loader.dataset.cache.name
    print(json.dumps({"pid": __import__("os").getpid(), "name": name, **loader.stats()}), flush=True)
    sys.stdin.readline()  # stay attached until the test says so
""")


def _coordl_caches() -> set[str]:
    return {n for n in os.listdir(shm.SHM_DIR) if n.startswith(shm.PREFIX)}


def test_two_jobs_in_two_processes_share_one_segment_and_the_second_hits_at_once(own_root, tmp_path):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    capacity = ds.manifest.total_bytes // 2
    name = shm.segment_name(ds.fingerprint)
    before = _coordl_caches()
    jobs = []
    try:
        for _ in range(2):
            job = subprocess.Popen([sys.executable, "-c", _JOB, own_root, str(capacity)], cwd=tmp_path,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            jobs.append(job)
            line = job.stdout.readline()
            assert line, f"job {job.pid} failed"
            job.stats = json.loads(line)
        a, b = jobs[0].stats, jobs[1].stats
        assert a["name"] == b["name"] == name
        assert _coordl_caches() - before == {name}                         # one segment, not two
        size = os.stat(os.path.join(shm.SHM_DIR, name)).st_blocks * 512
        index = data_offset(len(ds))                                       # memory: one segment,
        assert index + a["cache_bytes"] <= size <= index + a["cache_bytes"] + 4096  # what it holds
        assert a["storage_reads"] == len(ds) and a["cache_inserts"] == a["cache_items"]
        assert b["cache_hits"] == a["cache_items"] and b["cache_inserts"] == 0   # first epoch hits
        assert b["storage_bytes"] == ds.manifest.total_bytes - a["cache_bytes"]
        (info,) = [c for c in admin.list_caches() if c.name == name]
        assert info.creator_pid == jobs[0].pid and {j.pid for j in jobs} <= set(info.attached)
    finally:
        for job in jobs:
            job.communicate("\n", timeout=30)
        shm.unlink(os.path.join(shm.SHM_DIR, name))
    assert all(job.returncode == 0 for job in jobs)


def test_cache_outlives_the_loader_and_a_restarted_job_hits_at_once(own_root, dropped):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    dropped.append(ds)
    loader = coordl.DataLoader(ds, batch_size=8, cache="1MiB")
    epoch_counts(loader)
    loader.dataset.cache.close()
    del loader
    again = coordl.ImageFolder(own_root, transform="val", size=32)
    loader = coordl.DataLoader(again, batch_size=8, cache="4MiB")
    dropped.append(loader.dataset)
    first = epoch_counts(loader)
    assert first["cache_hits"] == len(again) and first["storage_reads"] == 0
    # 1 MiB and 4 MiB are both capped to the dataset's bytes: the same cache, attached to
    assert loader.dataset.cache.capacity == again.manifest.total_bytes


def test_changed_file_gives_a_new_fingerprint_and_a_new_cache(own_root, dropped):
    old = coordl.ImageFolder(own_root, transform="val", size=32)
    old_loader = coordl.DataLoader(old, batch_size=8, cache="1MiB")
    dropped.append(old_loader.dataset)
    epoch_counts(old_loader)
    victim, donor = old.manifest.path(3), old.manifest.path(7)
    shutil.copyfile(donor, victim)                         # same name, other bytes
    new = coordl.ImageFolder(own_root, transform="val", size=32)
    assert new.fingerprint != old.fingerprint
    loader = coordl.DataLoader(new, batch_size=8, cache="1MiB")
    dropped.append(loader.dataset)
    new_cache, old_cache = loader.dataset.cache, old_loader.dataset.cache
    assert new_cache.name != old_cache.name and new_cache.stats()["cache_items"] == 0
    first = epoch_counts(loader)
    assert first["cache_hits"] == 0 and first["storage_reads"] == len(new)
    assert bytes(loader.dataset.fetch(3)) == _read(new, 7)


def test_capacity_beyond_free_space_is_capped_to_the_dataset(own_root, dropped):
    """More than the folder holds, over a dataset that fits: capped, accepted (a cache that could
    never fit its dataset is refused with the free space: tests/cache/minio/test_minio.py)."""
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    dropped.append(ds)
    free = shm.free_bytes(shm.SHM_DIR)
    loader = coordl.DataLoader(ds, batch_size=8, cache=free + 2**30)
    dropped.append(loader.dataset)
    assert loader.dataset.cache.capacity == ds.manifest.total_bytes


def test_a_never_iterated_loader_takes_the_index_only(own_root, dropped):
    """Issue 24: cache="1GiB" over a small dataset took 1 GiB of /dev/shm at once."""
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    dropped.append(ds)
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=0, cache="1GiB")
    dropped.append(loader.dataset)
    cache = loader.dataset.cache
    assert cache.capacity == ds.manifest.total_bytes and cache.requested == 2**30
    assert os.stat(cache.path).st_size == data_offset(len(ds)) + ds.manifest.total_bytes
    assert os.stat(cache.path).st_blocks * 512 <= data_offset(len(ds))   # no arena page yet
    first, second = epoch_counts(loader), epoch_counts(loader)
    assert first["cache_inserts"] == len(ds) and second["cache_hits"] == len(ds)  # all of it fits
    assert second["storage_reads"] == 0


def test_another_size_is_refused_while_in_use_and_honoured_once_unused(own_root, dropped):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    dropped.append(ds)
    total = ds.manifest.total_bytes
    holder = coordl.DataLoader(ds, batch_size=8, cache=total // 2)
    dropped.append(holder.dataset)
    epoch_counts(holder)
    for other in (total // 4, "10GiB"):                        # "10GiB": capped to `total`, still not total // 2
        with pytest.raises(coordl.CacheError) as e:
            coordl.DataLoader(ds, batch_size=8, cache=other)
        msg = str(e.value)
        assert shm.fmt_bytes(total // 2) in msg and str(total // 2) in msg and str(os.getpid()) in msg
        assert shm.fmt_bytes(parse_size(other) if other != "10GiB" else total) in msg
    assert "capped to the dataset" in msg and "stop those processes" in msg
    same = coordl.DataLoader(ds, batch_size=8, cache=total // 2)   # the same size shares it
    assert epoch_counts(same)["cache_hits"] == holder.stats()["cache_items"]
    holder.dataset.cache.close()
    same.dataset.cache.close()
    smaller = coordl.DataLoader(ds, batch_size=8, cache=total // 4)  # nobody uses it: a new cache
    dropped.append(smaller.dataset)
    assert smaller.dataset.cache.capacity == total // 4 and smaller.stats()["cache_items"] == 0
    first = epoch_counts(smaller)
    assert first["storage_reads"] == len(ds) and 0 < smaller.stats()["cache_bytes"] <= total // 4


def test_cache_arguments(own_root, dropped):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    dropped.append(ds)
    cache = coordl.MinIOCache("1MiB")
    bound = coordl.DataLoader(ds, cache=cache, drop_page_cache=False).dataset
    dropped.append(bound)
    assert bound.cache is cache and bound.drop_page_cache is False and cache.name is not None
    assert ds.cache is None and bound is not ds
    with pytest.raises(coordl.ConfigError, match="coordl dataset"):
        coordl.DataLoader(list(range(10)), cache="1MiB")
    with pytest.raises(coordl.ConfigError, match="cache='lots'"):
        coordl.DataLoader(coordl.ImageFolder(own_root), cache="lots")


@pytest.mark.parametrize("text,size", [
    ("8GiB", 8 * 2**30), ("8G", 8 * 2**30), ("8GB", 8 * 10**9), ("512 MiB", 512 * 2**20),
    ("1.5k", 1536), ("100", 100), (4096, 4096),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "8XB", "-1G", "0", 0, -3, 2.5, None, True])
def test_parse_size_refuses(bad):
    with pytest.raises(coordl.ConfigError, match="cache="):
        parse_size(bad)


def test_two_loaders_on_one_dataset_keep_their_own_counters_and_caches(own_root, dropped):
    """The loader binds a copy (CoordlDataset.bind): the user's object gets no attribute, and a
    cached and an uncached loader over it, with different worker counts, stay apart."""
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    before = dict(vars(ds))
    cached = coordl.DataLoader(ds, batch_size=8, num_workers=2, cache="1MiB")
    dropped.append(cached.dataset)
    plain = coordl.DataLoader(ds, batch_size=8, num_workers=0)
    assert vars(ds) == before                                 # nothing added or changed on it
    assert ds.cache is None and plain.dataset.cache is None and cached.dataset.cache is not None
    first, second = epoch_counts(cached), epoch_counts(cached)
    assert first["storage_reads"] == len(ds) and second["cache_hits"] == len(ds)
    alone = epoch_counts(plain)
    assert alone["storage_reads"] == len(ds) and alone["cache_hits"] == alone["cache_misses"] == 0
    assert plain.stats()["samples"] == len(ds)                # its own counters only
    assert cached.stats()["samples"] == 2 * len(ds)
    assert vars(ds) == before
    cached.dataset.cache.drop()
    with pytest.raises(coordl.CacheError, match="closed or dropped"):
        cached.dataset.fetch(0)
    assert ds.fetch(0) == _read(ds, 0)                        # the user's dataset reads storage


def test_cache_for_asks_the_class_not_the_attributes(tiny_root):
    from coordl.datasets.caching import cache_for

    real = coordl.ImageFolder(tiny_root, transform="val", size=32)

    class Lookalike:  # a fingerprint, a manifest and a root: still not a coordl dataset
        fingerprint, manifest, root = real.fingerprint, real.manifest, real.root

        def __len__(self) -> int:
            return len(real)

    with pytest.raises(coordl.ConfigError, match="cache= needs a coordl dataset.*Lookalike"):
        cache_for(Lookalike(), "1MiB")
