"""coordl.cache.minio.cache: admission, sharing between processes, SIGKILL mid-insert, bad input."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import random
import secrets
import signal
import threading

import numpy as np
import pytest

from coordl.cache import shm
from coordl.cache.minio.cache import MinIOCache
from coordl.errors import CacheError, ConfigError
from coordl.manifest.build import scan

FORK = mp.get_context("fork")


@pytest.fixture
def new_cache():
    """make(capacity, n_items, fingerprint=None, **kw) -> an open cache, dropped after the test."""
    made: list[MinIOCache] = []

    def make(capacity: int, n_items: int, fingerprint: str | None = None, **kw) -> MinIOCache:
        cache = MinIOCache(capacity, **kw).open(fingerprint or secrets.token_hex(32), n_items)
        made.append(cache)
        return cache

    try:
        yield make
    finally:
        for cache in made:
            cache.drop()


def _item(i: int) -> bytes:
    """Deterministic content of item i, 1..3000 bytes."""
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, 1 + (i * 7919) % 3000, dtype=np.uint8).tobytes()


def _check_entries(cache: MinIOCache, expected) -> int:
    """Every published entry equals expected(i); entries never overlap; returns the number cached."""
    seg = cache._seg
    cached = np.flatnonzero(seg.lengths)
    for i in cached:
        assert cache.get(int(i)) == expected(int(i)), f"item {i} served wrong bytes"
    spans = sorted((int(seg.offsets[i]), int(seg.lengths[i])) for i in cached)
    for (o1, n1), (o2, _) in zip(spans, spans[1:]):
        assert o1 + n1 <= o2, "two entries overlap in the arena"
    assert seg.cached_bytes() <= seg.used <= seg.capacity
    return len(cached)


def test_get_is_a_zero_copy_view_of_what_put_stored(new_cache):
    cache = new_cache(10_000, 5)
    assert cache.get(1) is None
    assert cache.put(1, b"jpeg bytes") is True
    view = cache.get(1)
    assert isinstance(view, memoryview) and view == b"jpeg bytes"
    assert isinstance(view.obj, __import__("mmap").mmap)  # a view of the shared mapping, no copy
    assert cache.stats() == {"cache_bytes": 10, "cache_items": 1, "cache_capacity": 10_000, "cache_corrupt": 0}
    with pytest.raises(IndexError):
        cache.get(5)
    with pytest.raises(IndexError):
        cache.put(-1, b"x")


def test_first_touch_until_full_never_evict_never_replace(new_cache):
    cache = new_cache(100, 6)
    assert cache.put(0, b"a" * 40)
    assert cache.put(1, b"b" * 40)
    assert not cache.put(2, b"c" * 40)      # does not fit: 80 + 40 > 100
    assert cache.put(3, b"d" * 20)          # still fits: first touch until full
    assert not cache.put(4, b"e")           # full, nothing is evicted for it
    assert not cache.put(0, b"z" * 10)      # never replaced
    assert not cache.put(5, b"")            # nothing to cache
    assert cache.get(0) == b"a" * 40 and cache.get(2) is None and cache.get(4) is None
    assert cache.stats()["cache_bytes"] == 100 and cache.stats()["cache_items"] == 3


def test_second_opener_of_the_same_capacity_attaches_by_fingerprint(new_cache):
    fp = secrets.token_hex(32)
    first = new_cache(4096, 3, fp)
    first.put(2, b"shared")
    second = new_cache(4096, 3, fp)
    assert second.path == first.path and second.capacity == 4096
    assert second.get(2) == b"shared"
    assert [n for n in os.listdir(shm.SHM_DIR) if n == first.name] == [first.name]
    with pytest.raises(CacheError, match="4096"):   # another capacity: never silently this one
        MinIOCache(10**9).open(fp, 3)               # (tests/cache/minio/test_minio_capacity.py)


def test_two_datasets_never_see_each_others_entries(new_cache):
    a, b = new_cache(4096, 4), new_cache(4096, 4)
    assert a.name != b.name
    a.put(1, b"from a")
    assert b.get(1) is None
    b.put(1, b"from b")
    assert a.get(1) == b"from a" and b.get(1) == b"from b"
    # a segment name pinned with name= refuses a dataset it was not made for
    c = new_cache(4096, 4, name=f"test-{os.getpid()}")
    with pytest.raises(CacheError, match="holds dataset"):
        MinIOCache(4096, name=f"test-{os.getpid()}").open(secrets.token_hex(32), 4)
    assert c.get(1) is None


def test_capacity_larger_than_free_space_is_refused_with_both_sizes_and_the_fix():
    before = set(os.listdir(shm.SHM_DIR))
    free = shm.free_bytes(shm.SHM_DIR)
    cache = MinIOCache(free + 2**30)
    with pytest.raises(CacheError) as e:
        cache.open(secrets.token_hex(32), 100)
    msg = str(e.value)
    assert shm.fmt_bytes(free + 2**30) in msg and "free" in msg and "--shm-size" in msg
    assert f"does not fit {shm.SHM_DIR} (" in msg
    assert set(os.listdir(shm.SHM_DIR)) == before


def test_bad_capacity_and_unopened_use_are_refused():
    for bad in (0, -5, 1.5, "8 parsecs", True):
        with pytest.raises(ConfigError, match="capacity"):
            MinIOCache(bad)
    assert MinIOCache("8GiB").capacity == 8 * 2**30  # a size string, as coordl.MinIOCache took it
    with pytest.raises(CacheError, match="not open"):
        MinIOCache(100).get(0)


def test_pickle_carries_the_name_not_the_arena(new_cache):
    cache = new_cache(2**20, 10)
    cache.put(4, b"x" * 5000)
    blob = pickle.dumps(cache)
    assert len(blob) < 1000
    clone = pickle.loads(blob)
    try:
        assert clone.path == cache.path and clone.get(4) == b"x" * 5000
    finally:
        clone.close()


def _forked_put(cache: MinIOCache, i: int, raw: bytes, conn) -> None:
    conn.send(cache.put(i, raw))
    conn.send(sorted(cache._seg.attached()))
    conn.recv()  # stay attached until the parent has looked


def test_forked_child_writes_with_its_own_lock_and_is_listed_as_attached(new_cache):
    cache = new_cache(4096, 4)
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_forked_put, args=(cache, 3, b"child", child))
    p.start()
    try:
        assert parent.recv() is True
        assert p.pid in parent.recv() and os.getpid() in cache._seg.attached()
        assert cache.get(3) == b"child"
    finally:
        parent.send("done")
        p.join(10)
    assert p.pid not in cache._seg.attached()   # dead processes drop out of the table


# -- SIGKILL in the middle of an insert -------------------------------------------------

def _insert_and_hang_halfway(path_cache: MinIOCache, item: int, raw: bytes, conn) -> None:
    cache = path_cache

    def half_then_hang(seg, off, data):
        seg.arena[off:off + len(data) // 2] = data[:len(data) // 2]
        conn.send("reserved and half written, lock held")
        threading.Event().wait(60)

    cache._write = half_then_hang
    cache.put(item, raw)


def test_sigkill_while_holding_the_lock_mid_insert_leaves_nothing_readable(new_cache, tiny_root):
    m = scan(tiny_root)
    files = [open(m.path(i), "rb").read() for i in range(len(m))]
    cache = new_cache(sum(map(len, files)), len(m), m.fingerprint)
    cache.put(0, files[0])
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_insert_and_hang_halfway, args=(cache, 1, files[1], child))
    p.start()
    assert parent.poll(30), "the child never reached the middle of its insert"
    parent.recv()
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert cache._seg.used == len(files[0]) + len(files[1])   # its reservation is still there...
    assert cache.get(1) is None                                  # ...never readable
    probe = os.open(cache.path, os.O_RDWR)
    try:
        shm._lock(probe, shm.fcntl.F_OFD_SETLK, shm.fcntl.F_WRLCK, 0)  # not stuck: free at once
    finally:
        os.close(probe)
    for i in range(1, len(files)):
        cache.put(i, files[i])  # the first put takes the dead writer's reservation back
    assert _check_entries(cache, lambda i: files[i]) == len(files)  # so every item fits
    assert cache._seg.used == sum(map(len, files)) == cache._seg.capacity
    assert cache._seg.field("pending_item") == 0


def test_a_writer_killed_after_it_published_keeps_its_entry(new_cache):
    # the state a writer killed between storing the length and clearing pending_item leaves
    cache = new_cache(10_000, 4)
    assert cache.put(0, _item(0)) and cache.put(1, _item(1))
    seg = cache._seg
    seg.head["pending_item"], seg.head["pending_used"] = 2, len(_item(0))  # item 1 was pending
    assert cache.put(2, _item(2))
    assert seg.field("pending_item") == 0
    assert _check_entries(cache, _item) == 3  # item 1 kept, item 2 after it, no overlap
    assert seg.used == sum(len(_item(i)) for i in range(3))


def _insert_loop(cache: MinIOCache, paths: list[str], conn) -> None:
    conn.send("start")
    for i, path in enumerate(paths):
        with open(path, "rb") as f:
            cache.put(i, f.read())
    conn.send("done")
    threading.Event().wait(60)


def test_sigkill_at_random_moments_never_serves_a_half_written_item(new_cache, tiny_root):
    m = scan(tiny_root)
    paths = [m.path(i % len(m)) for i in range(40 * len(m))]  # 1600 inserts of the 40 real files
    files = {p: open(p, "rb").read() for p in set(paths)}
    rng = random.Random(4)
    killed_mid = 0
    for _ in range(6):
        cache = new_cache(sum(len(files[p]) for p in paths), len(paths))
        parent, child = FORK.Pipe()
        p = FORK.Process(target=_insert_loop, args=(cache, paths, child))
        p.start()
        assert parent.poll(30)
        parent.recv()
        threading.Event().wait(rng.uniform(0.0, 0.08))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        killed_mid += not parent.poll()
        n = _check_entries(cache, lambda i: files[paths[i]])
        # the writers' lock is free: the parent finishes the job
        for i, path in enumerate(paths):
            cache.put(i, files[path])
        assert n <= _check_entries(cache, lambda i: files[paths[i]]) == len(paths)  # nothing leaked
        cache.drop()
    assert killed_mid > 0, "no child was killed before it finished: the test proved nothing"


# -- concurrent writers ------------------------------------------------------------------

def _writer(cache: MinIOCache, seed: int, n_items: int) -> None:
    order = list(range(n_items))
    random.Random(seed).shuffle(order)
    for i in order:
        cache.put(i, _item(i))


def test_concurrent_writers_never_exceed_capacity_nor_corrupt(new_cache):
    n = 600
    total = sum(len(_item(i)) for i in range(n))
    cache = new_cache(total * 2 // 5, n)
    procs = [FORK.Process(target=_writer, args=(cache, s, n)) for s in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seg = cache._seg
    cached = _check_entries(cache, _item)
    assert 0 < cached < n and seg.cached_bytes() == seg.used  # no writer died: nothing leaked
    # first touch until full: every item left out does not fit what is left
    free = seg.capacity - seg.used
    assert all(len(_item(i)) > free for i in range(n) if seg.lengths[i] == 0)


def test_a_foreign_file_under_the_segment_name_is_refused_without_leaking(tmp_path):
    fp = secrets.token_hex(32)
    junk = tmp_path / shm.segment_name(fp)
    junk.write_bytes(b"not a segment" * 1000)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(CacheError, match="not a coordl cache segment.*coordl cache drop"):
            MinIOCache(4096, directory=str(tmp_path)).open(fp, 4)
    assert len(os.listdir("/proc/self/fd")) == fds
    assert junk.read_bytes() == b"not a segment" * 1000


@pytest.mark.parametrize("bad", ["", "a/b", ".hidden", "x.tmp-12"])
def test_unusable_names_are_refused(bad):
    with pytest.raises(ConfigError, match="name="):
        MinIOCache(4096, name=bad).open(secrets.token_hex(32), 4)


# -- checksums: a corrupt entry is never served ------------------------------------------

def _stats_in_child(cache: MinIOCache, conn) -> None:
    conn.send((cache.get(2), cache.stats()["cache_corrupt"]))


def test_a_corrupted_entry_is_counted_once_node_wide_and_never_served_again(new_cache):
    cache = new_cache(4096, 4)
    assert cache.put(1, b"good bytes") and cache.put(2, b"corrupt me")
    seg = cache._seg
    off = int(seg.offsets[2])
    seg.arena[off:off + 4] = b"\xde\xad\xbe\xef"       # a stray write into the shared arena
    assert cache.get(2) is None                         # detected: a miss, never the bad bytes
    assert cache.stats() == {"cache_bytes": 10, "cache_items": 1, "cache_capacity": 4096, "cache_corrupt": 1}
    assert cache.get(2) is None and cache.stats()["cache_corrupt"] == 1   # counted once, not per read
    assert cache.put(2, b"corrupt me") is False         # not re-admitted: served from storage from now on
    assert cache.get(2) is None and cache.get(1) == b"good bytes"
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_stats_in_child, args=(cache, child))
    p.start()
    assert parent.recv() == (None, 1)                   # the count is the segment's: every process sees it
    p.join(10)


def _publish_length_first_then_bytes(cache: MinIOCache, i: int, raw: bytes, conn) -> None:
    """A writer whose stores become visible in the worst order a weakly ordered CPU allows:
    offset, checksum and length before any of the bytes, all under the writers' lock."""
    from coordl.cache.checksum import digest

    with cache._writer() as seg:
        off = seg.used
        seg.head["used"] = off + len(raw)
        seg.offsets[i], seg.checksums[i], seg.lengths[i] = off, digest(raw), len(raw)
        conn.send("length published, bytes not yet")
        conn.recv()                                      # the parent's reader is waiting on our lock
        seg.arena[off:off + len(raw)] = raw


def _lock_waiters(path: str) -> int:
    """Blocked lock requests on the file at `path` (/proc/locks '->' lines for its inode)."""
    ino = os.stat(path).st_ino
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and f":{ino} " in line)


def test_a_reader_that_sees_the_length_before_the_bytes_waits_for_the_writer(new_cache):
    cache = new_cache(4096, 4)
    raw = _item(3)[:2000]
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_publish_length_first_then_bytes, args=(cache, 3, raw, child))
    p.start()
    try:
        assert parent.poll(30) and parent.recv()
        got: list = []
        reader = threading.Thread(target=lambda: got.append(cache.get(3)))
        reader.start()
        for _ in range(3000):                            # until the reader blocks on the writers' lock
            if _lock_waiters(cache.path):
                break
            threading.Event().wait(0.01)
        assert _lock_waiters(cache.path) == 1, "the reader did not wait for the writer"
        parent.send("finish")
        reader.join(30)
    finally:
        p.join(30)
    assert bytes(got[0]) == raw                          # the complete entry, not the zeros it first saw
    assert cache.stats()["cache_corrupt"] == 0           # and no false alarm
