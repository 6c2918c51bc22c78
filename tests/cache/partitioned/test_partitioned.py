"""The partitioned cache client (cache/partitioned/cache.py) against real redis-server processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal

import numpy as np
import pytest

from coordl.cache.partitioned import cache as partitioned
from coordl.cache.partitioned.cache import PartitionedCache
from coordl.errors import ConfigError
from coordl.loader.stats import Counters

FP = "c0ffee" * 10 + "abcd"
N = 120


def _items(n: int = N, size: int = 20_000) -> list[bytes]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, size=size + 37 * i % 900, dtype=np.uint8).tobytes() for i in range(n)]


def _cache(nodes, rank: int = 0, **kw) -> PartitionedCache:
    return PartitionedCache([n.url for n in nodes], rank, **kw).open(FP, N, "test")


def test_items_go_to_their_owner_and_come_back_equal(redis_nodes):
    nodes = [redis_nodes() for _ in range(3)]
    data = _items()
    writers = [_cache(nodes, r) for r in range(3)]
    for i, raw in enumerate(data):
        assert writers[i % 3].put(i, raw)          # any rank may write; the item lands on its owner
        assert not writers[(i + 1) % 3].put(i, raw)  # first touch only: never a second copy
    reader = writers[0]
    owners = [reader.owner(i) for i in range(N)]
    for j, node in enumerate(nodes):
        keys = {k.decode() for k in node.client().scan_iter(match="coordl:*")}
        assert keys == {reader.key(i) for i in range(N) if owners[i] == j} | {reader.meta_key, "coordl:members"}
    counters = Counters(0)
    hits = reader.get_many(range(N), counters)
    assert {i: bytes(v) for i, v in hits.items()} == dict(enumerate(data))
    t = counters.totals()
    local = [i for i in range(N) if owners[i] == 0]
    assert t["local_hits"] == len(local) and t["remote_hits"] == N - len(local)
    assert t["remote_bytes"] == sum(len(data[i]) for i in range(N) if owners[i] != 0)
    assert t["remote_errors"] == 0
    assert bytes(reader.get(5)) == data[5]
    s = writers[1].stats()
    mine = [i for i in range(N) if owners[i] == 1]
    assert s["cache_items"] == len(mine)
    assert s["cache_bytes"] == sum(len(data[i]) + partitioned.HEADER.size for i in mine)
    for w in writers:
        w.close()


def test_first_touch_until_the_capacity_is_reached(redis_nodes):
    node = redis_nodes()
    data = _items()
    cap = 10 * (len(data[0]) + 1000)
    cache = _cache([node], capacity_per_node=cap)
    admitted = [i for i, raw in enumerate(data) if cache.put(i, raw)]
    stored = sum(len(data[i]) + partitioned.HEADER.size for i in admitted)
    assert stored <= cap and stored + len(min(data, key=len)) + partitioned.HEADER.size > cap
    assert admitted == list(range(len(admitted)))          # the first items offered, nothing replaced
    assert set(cache.get_many(range(N))) == set(admitted)
    assert cache.stats()["cache_bytes"] == stored and cache.stats()["cache_capacity"] == cap


def test_a_full_node_refuses_writes_quietly_and_evicts_nothing(redis_nodes):
    node = redis_nodes(memory=3 * 2**20)                 # noeviction at 3 MiB: well under 120 x 20 KiB
    data = _items()
    cache = _cache([node])
    admitted = [i for i, raw in enumerate(data) if cache.put(i, raw)]
    assert 0 < len(admitted) < N
    assert not cache.put(N - 1, data[-1])                 # stays refused, no exception
    hits = cache.get_many(range(N))
    assert sorted(hits) == admitted and all(bytes(hits[i]) == data[i] for i in admitted)


def test_a_corrupted_value_is_counted_and_never_served(redis_nodes):
    node = redis_nodes()
    data = _items()
    cache = _cache([node])
    for i in range(4):
        cache.put(i, data[i])
    r = node.client()
    r.set(cache.key(0), b"garbage")                                   # not a coordl value
    value = bytearray(r.get(cache.key(1)))
    value[-1] ^= 0xFF                                                 # one flipped bit of payload
    r.set(cache.key(1), bytes(value))
    r.set(cache.key(2), r.get(cache.key(3)))                          # a valid value under the wrong key
    counters = Counters(0)
    hits = cache.get_many(range(4), counters)
    assert sorted(hits) == [3] and bytes(hits[3]) == data[3]
    assert counters.totals()["remote_errors"] == 3 and counters.totals()["local_hits"] == 1


def test_other_applications_keys_are_never_read_changed_or_flushed(redis_nodes):
    node = redis_nodes()
    r = node.client()
    theirs = {b"app:1": b"one", b"coordl": b"not ours", b"coordlx:1": b"nor this", b"session": b"s"}
    for k, v in theirs.items():
        r.set(k, v)
    r.hset(b"coordl:meta", mapping={b"x": b"1"})                        # looks like ours, is not
    other = PartitionedCache([node.url], 0).open("ab" * 32, N)          # another dataset on the node
    other.put(0, b"other dataset")
    before = {k: r.dump(k) for k in r.scan_iter()}
    cache = _cache([node])
    data = _items()
    for i in range(N):
        cache.put(i, data[i])
    cache.get_many(range(N))
    cache.stats()
    from coordl.cache.partitioned import redisnode
    assert set(redisnode.datasets(r)) == {FP[:32], ("ab" * 32)[:32]}
    assert cache.drop() == N + 1                                        # its items and its meta hash
    after = {k: r.dump(k) for k in r.scan_iter()}
    assert after == before
    assert bytes(other.get(0)) == b"other dataset"
    assert r.object("idletime", b"app:1") is not None


def test_a_stopped_node_is_skipped_and_used_again_when_back(redis_nodes):
    nodes = [redis_nodes() for _ in range(2)]
    data = _items()
    skipping = _cache(nodes, retry_after=3600.0)
    retrying = _cache(nodes, retry_after=0.0)
    for i in range(N):
        retrying.put(i, data[i])
    on_1 = [i for i in range(N) if retrying.owner(i) == 1]
    nodes[1].stop()
    for cache in (skipping, retrying):
        counters = Counters(0)
        hits = cache.get_many(range(N), counters)
        assert set(hits) == set(range(N)) - set(on_1)
        assert counters.totals()["remote_errors"] == 1            # one failed request, no exception
        assert not cache.put(on_1[0], data[on_1[0]])
    nodes[1].start()                                              # same port, empty (no persistence)
    assert skipping.get_many(on_1) == {} and not skipping.put(on_1[0], data[on_1[0]])  # still backing off
    assert retrying.put(on_1[0], data[on_1[0]])                   # admitted again
    assert bytes(retrying.get(on_1[0])) == data[on_1[0]]


def test_a_hung_node_times_out_and_is_skipped(redis_nodes):
    nodes = [redis_nodes() for _ in range(2)]
    data = _items()
    cache = _cache(nodes, timeout=0.2, retry_after=0.0)
    for i in range(N):
        cache.put(i, data[i])
    on_1 = {i for i in range(N) if cache.owner(i) == 1}
    os.kill(nodes[1].proc.pid, signal.SIGSTOP)
    try:
        counters = Counters(0)
        assert set(cache.get_many(range(N), counters)) == set(range(N)) - on_1
        assert counters.totals()["remote_errors"] == 1
    finally:
        os.kill(nodes[1].proc.pid, signal.SIGCONT)
    assert set(cache.get_many(range(N))) == set(range(N))


def _child(cache: PartitionedCache, n: int, out) -> None:
    hits = cache.get_many(range(n))
    out.put(sorted((i, bytes(v)[:16]) for i, v in hits.items()))


def test_forked_and_unpickled_copies_connect_on_their_own(redis_nodes):
    nodes = [redis_nodes() for _ in range(2)]
    data = _items()
    cache = _cache(nodes)
    for i in range(N):
        cache.put(i, data[i])
    cache.get_many(range(N))                       # the parent's pools and threads are in use
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(cache, N, out))
    p.start()
    got = out.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert got == [(i, data[i][:16]) for i in range(N)]
    clone = pickle.loads(pickle.dumps(cache))     # what a spawned worker gets: no re-check, lazy connect
    assert bytes(clone.get(3)) == data[3]


def test_pickled_state_carries_no_connection(redis_nodes):
    cache = _cache([redis_nodes()])
    state = cache.__getstate__()
    assert set(state) == {"nodes", "node_rank", "capacity_per_node", "timeout", "retry_after",
                          "fingerprint", "n", "label", "maxmemory", "health", "tls", "membership", "previous",
                          "read_ahead"}
    assert state["health"] is None          # the health table's fd crosses only while a process starts


def test_policies_that_evict_are_refused(redis_nodes):
    node = redis_nodes()
    r = node.client()
    for policy in ("allkeys-lru", "allkeys-lfu", "allkeys-random"):
        r.config_set("maxmemory-policy", policy)
        with pytest.raises(ConfigError, match=f"{node.port}.*{policy}.*thrash.*noeviction"):
            PartitionedCache([node.url], 0)
    r.config_set("maxmemory-policy", "volatile-lru")       # never picks coordl's keys: they have no TTL
    PartitionedCache([node.url], 0)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 0)
    with pytest.raises(ConfigError, match="no maxmemory.*capacity_per_node"):
        PartitionedCache([node.url], 0)
    PartitionedCache([node.url], 0, capacity_per_node=2**20)
