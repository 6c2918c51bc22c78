"""After a node list update, an item that changed owner is read from its previous owner (one MGET per
such node) and written to its new one, instead of from storage (cache/partitioned/membership.py PREVIOUS_KEY,
cache/partitioned/cache.py `_moved`). Real redis-servers; MGETs counted by each server's INFO commandstats."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from coordl_tests_loaderhelp import counts_delta

import coordl
from coordl.cache.partitioned import membership, redisnode
from coordl.cache.partitioned.cache import PartitionedCache
from coordl.cli.make_dataset import make_dataset
from coordl.loader.stats import Counters

FP = "cafe" * 16
N = 300


def _items(n: int = N) -> list[bytes]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, 256, size=200 + 11 * i % 300, dtype=np.uint8).tobytes() for i in range(n)]


def _cache(urls, rank: int = 0, **kw) -> PartitionedCache:
    return PartitionedCache(list(urls), rank, **kw).open(FP, N, "moved")


def _mgets(node) -> int:
    return int(node.client().info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


def _read(cache: PartitionedCache, items) -> tuple[dict, dict]:
    counters = Counters(0)
    hits = cache.get_many(items, counters)
    return hits, counters.totals()


def _fill(cache: PartitionedCache, data: list[bytes]) -> None:
    for i, raw in enumerate(data):
        assert cache.put(i, raw)


def test_an_added_nodes_items_come_from_their_previous_owner_then_from_it(redis_nodes):
    nodes = [redis_nodes() for _ in range(3)]
    urls = [n.url for n in nodes]
    data = _items()
    old = _cache(urls[:2])
    _fill(old, data)
    new = _cache(urls, 1, membership="update")
    names = [redisnode.node_name(u) for u in urls]
    for n in nodes[:2]:                                   # the nodes that stay hold the list replaced
        assert membership.read_previous(n.client()) == sorted(names[:2])
    assert membership.read_previous(nodes[2].client()) is None   # the added one had none
    moved = [i for i in range(N) if new.owner(i) == 2]
    assert 0.2 < len(moved) / N < 0.45, len(moved)
    before = [_mgets(n) for n in nodes]
    hits, st = _read(new, range(N))
    assert set(hits) == set(range(N)) and all(bytes(v) == data[i] for i, v in hits.items())
    assert st["moved_hits"] == st["cache_inserts"] == len(moved)
    assert st["local_hits"] + st["remote_hits"] == N and st["remote_errors"] == 0
    on_new_rank = sum(1 for i in moved if old.owner(i) == 1)   # node_rank 1: those were local reads
    assert st["local_hits"] == sum(1 for i in range(N) if new.owner(i) == 1) + on_new_rank
    # one MGET per owner (2 stayed nodes + the new one, empty), then one per previous owner
    assert [_mgets(n) - b for n, b in zip(nodes, before)] == [2, 2, 1]
    assert nodes[2].client().hget(new.meta_key, "items") == str(len(moved)).encode()
    before = [_mgets(n) for n in nodes]
    hits, st = _read(new, range(N))                       # now every item is on its owner
    assert len(hits) == N and all(bytes(v) == data[i] for i, v in hits.items())
    assert (st["moved_hits"], st["cache_inserts"]) == (0, 0)
    assert [_mgets(n) - b for n, b in zip(nodes, before)] == [1, 1, 1]
    again = _cache(urls, 0)                               # a rank connecting later reads the previous list
    assert again._previous == sorted(names[:2])
    clone = pickle.loads(pickle.dumps(again))             # a spawned worker: the previous list by pickle
    assert clone._previous == again._previous and clone._was is not None
    clone.close()
    # a miss whose previous owner is its owner (never cached) costs no extra request
    new.drop()
    before = [_mgets(n) for n in nodes]
    stay = [i for i in range(N) if i not in set(moved)][:20]
    hits, st = _read(again, stay)
    assert hits == {} and st["moved_hits"] == 0
    assert sum(_mgets(n) - b for n, b in zip(nodes, before)) == len({again.owner(i) for i in stay})
    # moved items missing on their previous owner too: one MGET there, nothing found, nothing written
    hits, st = _read(again, moved[:10])
    assert hits == {} and (st["moved_hits"], st["cache_inserts"], st["remote_errors"]) == (0, 0, 0)
    for c in (old, new, again):
        c.close()


def test_a_removed_nodes_items_come_from_storage_with_no_extra_request(redis_nodes):
    nodes = [redis_nodes() for _ in range(3)]
    urls = [n.url for n in nodes]
    data = _items()
    old = _cache(urls)
    _fill(old, data)
    theirs = {i for i in range(N) if old.owner(i) == 2}
    nodes[2].stop()
    new = _cache(urls[:2], 0, membership="update")
    before = [_mgets(n) for n in nodes[:2]]
    hits, st = _read(new, range(N))
    assert set(hits) == set(range(N)) - theirs and all(bytes(v) == data[i] for i, v in hits.items())
    assert (st["moved_hits"], st["cache_inserts"]) == (0, 0)
    assert [_mgets(n) - b for n, b in zip(nodes[:2], before)] == [1, 1]   # their previous owner is gone
    old.close()
    new.close()


def test_without_an_update_no_extra_request(redis_nodes):
    nodes = [redis_nodes() for _ in range(2)]
    urls = [n.url for n in nodes]
    data = _items()
    cache = _cache(urls)
    assert cache._previous is None and cache._was is None
    for i in range(0, N, 2):
        cache.put(i, data[i])
    again = _cache(urls, 1, membership="update")          # the same list: nothing replaced
    assert again._previous is None and all(membership.read_previous(n.client()) is None for n in nodes)
    before = [_mgets(n) for n in nodes]
    hits, st = _read(again, range(N))
    assert set(hits) == set(range(0, N, 2)) and st["moved_hits"] == 0
    assert [_mgets(n) - b for n, b in zip(nodes, before)] == [1, 1]
    cache.close()
    again.close()


def test_the_previous_list_is_the_one_most_nodes_hold():
    assert membership.previous_of([None, None]) is None
    assert membership.previous_of([["b", "a"], None, ["a", "b"], ["a", "c"]]) == ["a", "b"]
    assert membership.previous_of([["a", "c"], ["a", "b"]]) == ["a", "b"]   # a tie: the smallest record


# -- through coordl.DataLoader, 2 worker processes --

ITEMS = 48


@pytest.fixture(scope="module")
def jpeg_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("moved"))
    make_dataset(root, images=ITEMS, classes=3, size=(96, 64), quality=90, seed=3, workers=1, progress=False)
    return root


def _images_and_counts(ds, cache=None) -> tuple[list[np.ndarray], dict]:
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=False, num_workers=2, cache=cache)
    before = loader.stats()
    images = [x.numpy().copy() for x, _ in loader]
    after = loader.stats()
    return images, counts_delta(before, after, ("storage_reads", "moved_hits", "cache_inserts", "local_hits",
                                                "remote_hits", "remote_errors"))


def test_loader_epoch_after_adding_a_node_reads_nothing_from_storage(redis_nodes, jpeg_root):
    nodes = [redis_nodes() for _ in range(3)]
    urls = [n.url for n in nodes]
    ds = coordl.ImageFolder(jpeg_root, transform="val", size=32)
    want, st = _images_and_counts(ds)                                  # the local dataset, no cache
    assert st["storage_reads"] == ITEMS
    two = PartitionedCache(urls[:2], 0, timeout=5.0)
    got, st = _images_and_counts(ds, two)                              # fills the 2 nodes
    assert st["storage_reads"] == ITEMS and st["cache_inserts"] == ITEMS
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    three = PartitionedCache(urls, 0, timeout=5.0, membership="update")
    got, st = _images_and_counts(ds, three)
    moved = sum(1 for i in range(ITEMS) if three.owner(i) == 2)
    assert moved > 0
    assert st["storage_reads"] == 0 and st["remote_errors"] == 0, st      # every moved item from its old owner
    assert st["moved_hits"] == st["cache_inserts"] == moved, st
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert nodes[2].client().hget(three.meta_key, "items") == str(moved).encode()
    before = _mgets(nodes[2])
    got, st = _images_and_counts(ds, three)                            # then read on the new node
    assert (st["storage_reads"], st["moved_hits"], st["cache_inserts"]) == (0, 0, 0), st
    assert st["local_hits"] + st["remote_hits"] == ITEMS
    batches = sum(1 for b in range(0, ITEMS, 8) if any(three.owner(i) == 2 for i in range(b, b + 8)))
    assert _mgets(nodes[2]) - before == batches           # one MGET per batch with one of its items
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    for c in (two, three):
        c.close()
