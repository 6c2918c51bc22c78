"""coordl.cache.minio.cache reserves only what it can use (issue 24, point 6).

The capacity is capped to the dataset's bytes; a new segment allocates its header and index and
the arena page by page as items are admitted (a full tmpfs refuses the put, never SIGBUS); another
size for an existing cache is honoured by a new segment when no process uses the old one, and
refused with both sizes and the fix when one does.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import subprocess

import pytest

from coordl.cache import shm
from coordl.cache.minio.cache import MinIOCache
from coordl.cache.minio.layout import data_offset
from coordl.errors import CacheError

FORK = mp.get_context("fork")


def _allocated(path: str) -> int:
    """Bytes the file really takes (what `du` says), not its length."""
    return os.stat(path).st_blocks * 512


@pytest.fixture
def opened():
    """open(capacity, n_items, fingerprint, **kw) -> an open cache, dropped after the test."""
    made: list[MinIOCache] = []

    def make(capacity: int, n_items: int, fingerprint: str, dataset_bytes: int | None = None,
             **kw) -> MinIOCache:
        cache = MinIOCache(capacity, **kw)
        made.append(cache)
        return cache.open(fingerprint, n_items, dataset_bytes=dataset_bytes)

    try:
        yield make
    finally:
        for cache in made:
            cache.drop()


def _cache_names(directory: str = shm.SHM_DIR) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(shm.PREFIX))


def test_capacity_is_capped_to_the_dataset_bytes(opened):
    cache = opened(2**30, 10, secrets.token_hex(32), dataset_bytes=5000)
    assert cache.capacity == 5000 and cache.stats()["cache_capacity"] == 5000
    assert os.stat(cache.path).st_size == data_offset(10) + 5000
    assert all(cache.put(i, b"x" * 1000) for i in range(5))     # the whole dataset fits
    assert cache.stats()["cache_bytes"] == 5000


def test_a_new_segment_allocates_its_index_only_and_the_arena_as_it_fills(opened):
    cache = opened(64 * 2**20, 1000, secrets.token_hex(32))
    assert os.stat(cache.path).st_size == data_offset(1000) + 64 * 2**20
    assert _allocated(cache.path) <= data_offset(1000)          # header and index, no arena
    for i in range(100):
        assert cache.put(i, bytes([i]) * 10_000)
    assert 100 * 10_000 <= _allocated(cache.path) <= data_offset(1000) + 100 * 10_000 + 4096
    assert all(cache.get(i) == bytes([i]) * 10_000 for i in range(100))


def test_another_size_while_in_use_is_refused_with_both_sizes_and_the_fix(opened):
    fp = secrets.token_hex(32)
    first = opened(4096, 4, fp)
    first.put(0, b"kept")
    with pytest.raises(CacheError) as e:
        MinIOCache(8192).open(fp, 4)
    msg = str(e.value)
    assert "4.0 KiB" in msg and "8.0 KiB" in msg and str(os.getpid()) in msg
    assert "4096" in msg and "stop" in msg
    assert first.get(0) == b"kept" and first.capacity == 4096     # the old one is untouched
    assert _cache_names() == [first.name]                          # nothing else made, no tmp left


def test_another_size_when_unused_is_honoured_by_a_new_segment(opened):
    fp = secrets.token_hex(32)
    first = opened(4096, 4, fp)
    first.put(0, b"old")
    old_inode = os.stat(first.path).st_ino
    first.close()
    second = opened(8192, 4, fp)
    assert second.capacity == 8192 and second.stats()["cache_capacity"] == 8192
    assert second.get(0) is None and os.stat(second.path).st_ino != old_inode
    assert _cache_names() == [second.name]
    second.close()
    third = opened(1024, 4, fp)                                    # smaller works too
    assert third.capacity == 1024 and _cache_names() == [third.name]


def _hold(fp: str, conn) -> None:
    MinIOCache(4096).open(fp, 4)
    conn.send("attached")
    conn.recv()


def test_a_holder_killed_by_sigkill_does_not_keep_the_old_size(opened):
    fp = secrets.token_hex(32)
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_hold, args=(fp, child))
    p.start()
    try:
        assert parent.recv() == "attached"
        with pytest.raises(CacheError, match=str(p.pid)):
            MinIOCache(8192).open(fp, 4)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.join(10)
    cache = opened(8192, 4, fp)
    assert cache.capacity == 8192


def test_sizes_are_compared_after_the_cap(opened):
    fp = secrets.token_hex(32)
    first = opened(10**9, 4, fp, dataset_bytes=5000)
    second = opened(2 * 10**9, 4, fp, dataset_bytes=5000)        # both capped to 5000: shared
    assert first.capacity == second.capacity == 5000 and second.path == first.path
    with pytest.raises(CacheError, match="5000"):
        MinIOCache(3000).open(fp, 4, dataset_bytes=5000)          # 3000 differs, and 5000 is in use


def _open_new_size(fp: str, barrier, conn) -> None:
    barrier.wait()
    try:
        cache = MinIOCache(8192).open(fp, 4)
        conn.send((os.fstat(cache._seg.fd).st_ino, cache.capacity))
    except CacheError as e:  # sent to the test, which fails with it
        conn.send(repr(e))
    conn.recv()


def test_openers_racing_with_a_new_size_all_end_on_one_new_segment(opened):
    fp = secrets.token_hex(32)
    opened(4096, 4, fp).close()
    barrier = FORK.Barrier(4)
    pipes = [FORK.Pipe() for _ in range(4)]
    procs = [FORK.Process(target=_open_new_size, args=(fp, barrier, c)) for _, c in pipes]
    for p in procs:
        p.start()
    try:
        got = [parent.recv() for parent, _ in pipes]
    finally:
        for parent, _ in pipes:
            parent.send("done")
        for p in procs:
            p.join(10)
    assert all(isinstance(g, tuple) for g in got), got
    assert len({ino for ino, _ in got}) == 1 and {cap for _, cap in got} == {8192}
    assert os.stat(os.path.join(shm.SHM_DIR, shm.segment_name(fp))).st_ino == got[0][0]
    assert [n for n in _cache_names() if n.startswith(shm.segment_name(fp))] == [shm.segment_name(fp)]


# -- a tmpfs that fills up after the cache was made ---------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs of this test alone (needs root, or skips)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (and mount rights in this container)")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(cache: MinIOCache, conn) -> None:
    conn.send([cache.put(i, bytes([i]) * 10_000) for i in range(60)])


def test_a_full_tmpfs_refuses_the_put_never_sigbus(small_tmpfs):
    cache = MinIOCache(600_000, directory=small_tmpfs).open(secrets.token_hex(32), 100)
    try:
        with open(os.path.join(small_tmpfs, "other"), "wb") as f:  # someone else takes the space
            f.write(b"\0" * 700_000)
        parent, child = FORK.Pipe()
        p = FORK.Process(target=_fill, args=(cache, child))       # a SIGBUS would kill it
        p.start()
        admitted = parent.recv() if parent.poll(30) else None
        p.join(10)
        assert p.exitcode == 0 and admitted is not None
        n = sum(admitted)
        assert 0 < n < 60 and admitted == [True] * n + [False] * (60 - n)
        assert cache.stats()["cache_items"] == n
        assert all(cache.get(i) == bytes([i]) * 10_000 for i in range(n))
    finally:
        cache.drop()
