"""PartitionedCache.send_ahead: the next batch's MGETs are sent while this one is prepared and read
by the get_many that asks for exactly those items; nothing is sent twice, other items still come
back right, a forked child never reads its parent's pending replies, and a DataLoader's batches are
byte-identical with it on and off. Real redis-servers; MGETs counted by INFO commandstats."""

from __future__ import annotations

import numpy as np

import coordl
from coordl.cache.partitioned.cache import PartitionedCache
from coordl.cli.make_dataset import make_dataset
from coordl.loader.stats import Counters

FP = "beef" * 16
N = 90


def _items() -> list[bytes]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, size=30_000 + 97 * i, dtype=np.uint8).tobytes() for i in range(N)]


def _mgets(node) -> int:
    return int(node.client().info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


def _filled(redis_nodes):
    nodes = [redis_nodes() for _ in range(3)]
    cache = PartitionedCache([n.url for n in nodes], 0).open(FP, N, "ahead")
    data = _items()
    for i, raw in enumerate(data):
        assert cache.put(i, raw)
    return nodes, cache, data


def test_the_next_batch_is_sent_once_and_read_by_its_get_many(redis_nodes):
    nodes, cache, data = _filled(redis_nodes)
    a, b = list(range(0, 30)), list(range(50, 80))
    before = [_mgets(n) for n in nodes]
    cache.send_ahead(a)
    sent = [_mgets(n) - x for n, x in zip(nodes, before)]
    assert sent == [1, 1, 1]                      # out already: one MGET per owner
    counters = Counters(0)
    hits = cache.get_many(a, counters)
    assert [_mgets(n) - x for n, x in zip(nodes, before)] == sent   # read, not sent again
    assert set(hits) == set(a) and all(bytes(v) == data[i] for i, v in hits.items())
    st = counters.totals()
    assert st["local_hits"] + st["remote_hits"] == len(a)
    assert st["local_hits"] == sum(cache.owner(i) == 0 for i in a) and st["ahead_hits"] == len(a)
    # asked for other items: the pending replies are read and dropped, the others sent and right
    cache.send_ahead(a)
    before = [_mgets(n) for n in nodes]
    hits = cache.get_many(b)
    assert set(hits) == set(b) and all(bytes(v) == data[i] for i, v in hits.items())
    assert [_mgets(n) - x for n, x in zip(nodes, before)] == [1, 1, 1]
    hits = cache.get_many(a)                      # nothing pending now: sent and read as usual
    assert set(hits) == set(a) and all(bytes(v) == data[i] for i, v in hits.items())
    cache.send_ahead(b)                           # replaced by the next send_ahead
    cache.send_ahead(a)
    assert {i: bytes(v) for i, v in cache.get_many(a).items()} == {i: data[i] for i in a}
    off = PartitionedCache([n.url for n in nodes], 0, read_ahead=False).open(FP, N, "ahead")
    before = [_mgets(n) for n in nodes]
    off.send_ahead(a)                             # read_ahead=False: nothing goes out
    assert [_mgets(n) - x for n, x in zip(nodes, before)] == [0, 0, 0]
    assert {i: bytes(v) for i, v in off.get_many(a).items()} == {i: data[i] for i in a}
    off.close()
    cache.drop()
    cache.close()


def test_a_forked_child_never_reads_its_parents_pending_replies(redis_nodes, in_child):
    nodes, cache, data = _filled(redis_nodes)
    a = list(range(10, 40))
    cache.send_ahead(a)

    def child() -> bool:                          # its own connections, its own MGETs
        hits = cache.get_many(a)
        return set(hits) == set(a) and all(bytes(v) == data[i] for i, v in hits.items())

    assert in_child(child) == 0
    before = [_mgets(n) for n in nodes]
    hits = cache.get_many(a)                      # the parent reads what it sent before the fork
    assert [_mgets(n) - x for n, x in zip(nodes, before)] == [0, 0, 0]
    assert set(hits) == set(a) and all(bytes(v) == data[i] for i, v in hits.items())
    cache.drop()
    cache.close()


def test_a_loader_gives_the_same_batches_with_the_same_requests_on_and_off(redis_nodes, tmp_path):
    root = str(tmp_path / "data")
    make_dataset(root, images=60, classes=3, size=(96, 72), quality=85, seed=9, workers=1, progress=False)
    nodes = [redis_nodes() for _ in range(3)]
    urls = [n.url for n in nodes]
    epochs: dict[bool, list] = {}
    for ahead in (False, True):
        ds = coordl.ImageFolder(root, transform="train", size=48, seed=4)
        cache = PartitionedCache(urls, 1, read_ahead=ahead)
        loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, persistent_workers=True,
                                   cache=cache)
        got = []
        for epoch in range(3):
            before = [_mgets(n) for n in nodes]
            got.append([(x.clone(), y.clone()) for x, y in loader])
            if epoch:                              # every item cached: MGETs only
                got[-1].append([_mgets(n) - b for n, b in zip(nodes, before)])
        epochs[ahead] = got
        st = loader.stats()
        del loader
        assert st["remote_errors"] == 0 and st["local_hits"] + st["remote_hits"] >= 2 * 60
        # on: every batch but each worker's first of an epoch was sent ahead (8 batches, 2 workers)
        assert st["ahead_hits"] == (3 * (60 - 2 * 8) if ahead else 0), st
        cache.close()
    for off, on in zip(epochs[False], epochs[True]):
        assert len(off) == len(on)
        for (xo, yo), (xa, ya) in zip(off[:8], on[:8]):
            assert xo.equal(xa) and yo.equal(ya)
    assert epochs[False][1][-1] == epochs[True][1][-1]   # the same MGETs per node per epoch
    assert epochs[False][2][-1] == epochs[True][2][-1]
