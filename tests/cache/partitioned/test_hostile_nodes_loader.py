"""coordl.DataLoader over a PartitionedCache whose nodes misbehave (real redis-server processes).

Every case: no exception reaches the training loop, every sample equals what its file decodes
to, and the fault is counted in loader.stats().
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from coordl_tests_loaderhelp import counts_delta

import coordl
from coordl.loader.partitioned import PartitionedCache
from coordl.pipelines import cpu

SIZE = 32
BATCH = 8


def _files(ds) -> dict[int, np.ndarray]:
    out = {}
    for i in range(len(ds)):
        with open(ds.manifest.path(i), "rb") as f:
            out[i] = cpu.val(f.read(), SIZE)
    return out


def _check_epoch(loader, want) -> None:
    """One epoch (shuffle=False: batch b holds items b*BATCH...), each row equal to its file."""
    seen = 0
    for b, (images, _labels) in enumerate(loader):
        for row in range(len(images)):
            i = b * BATCH + row
            assert np.array_equal(images[row].permute(1, 2, 0).numpy(), want[i]), f"item {i} differs from its file"
            seen += 1
    assert seen == len(want)


def _loader(ds, cache, workers: int = 0, **kw):
    return coordl.DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=workers,
                             persistent_workers=workers > 0, cache=cache, **kw)


_COUNTS = ("storage_reads", "local_hits", "remote_hits", "remote_errors")


def test_a_value_copied_from_another_dataset_is_read_from_storage(redis_nodes, tiny_root, photo_root):
    node = redis_nodes()
    ds, other = (coordl.ImageFolder(r, transform="val", size=SIZE) for r in (tiny_root, photo_root))
    want = _files(ds)
    theirs = PartitionedCache([node.url], 0)
    _loader(other, theirs)                                   # opens the other dataset's cache
    for i, raw in enumerate(open(other.manifest.path(i), "rb").read() for i in range(len(other))):
        theirs.put(i, raw)
    cache = PartitionedCache([node.url], 0)
    loader = _loader(ds, cache)
    _check_epoch(loader, want)                                     # fills this dataset's values
    r = node.client()
    copied = range(len(other))
    for i in copied:                                         # the other dataset's value for item i
        r.set(cache.key(i), r.get(theirs.key(i)))
    before = loader.stats()
    _check_epoch(loader, want)
    got = counts_delta(before, loader.stats(), _COUNTS)
    assert got == {"storage_reads": len(copied), "local_hits": len(ds) - len(copied), "remote_hits": 0,
                   "remote_errors": len(copied)}
    cache.close()
    theirs.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_node_made_a_read_only_replica_mid_run(redis_nodes, tiny_root, workers):
    nodes = [redis_nodes() for _ in range(2)]
    ds = coordl.ImageFolder(tiny_root, transform="val", size=SIZE)
    want = _files(ds)
    cache = PartitionedCache([n.url for n in nodes], 0, retry_after=3600.0)
    loader = _loader(ds, cache, workers)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    nodes[1].client().execute_command("REPLICAOF", "127.0.0.1", str(dead))   # "can't write against a replica"
    _check_epoch(loader, want)
    stats = loader.stats()
    assert stats["node_faults"] >= 1 and stats["nodes_down"] == 1
    assert stats["storage_reads"] == len(ds)
    assert nodes[1].client().dbsize() == 1  # the node list record (coordl:members) only
    _check_epoch(loader, want)                                     # node 0's share from memory, node 1 skipped
    del loader
    cache.close()


@pytest.mark.parametrize("poison", ["hset", "string"])
def test_a_poisoned_meta_hash(redis_nodes, tiny_root, poison):
    node = redis_nodes()
    ds = coordl.ImageFolder(tiny_root, transform="val", size=SIZE)
    want = _files(ds)
    cache = PartitionedCache([node.url], 0, retry_after=3600.0)
    loader = _loader(ds, cache)
    r = node.client()
    if poison == "hset":
        r.hset(cache.meta_key, "bytes", "lots")
    else:
        r.set(cache.meta_key, "a string")
    _check_epoch(loader, want)
    stats = loader.stats()
    assert stats["node_faults"] == 1 and stats["nodes_down"] == 1 and stats["storage_reads"] == len(ds)
    # nothing written beside the poisoned key and coordl:members
    assert stats["cache_inserts"] == 0 and r.dbsize() == 2
    cache.close()


def test_a_node_restarted_with_allkeys_lru_between_epochs(redis_nodes, tiny_root):
    nodes = [redis_nodes() for _ in range(2)]
    ds = coordl.ImageFolder(tiny_root, transform="val", size=SIZE)
    want = _files(ds)
    cache = PartitionedCache([n.url for n in nodes], 0, retry_after=3600.0)
    loader = _loader(ds, cache)
    _check_epoch(loader, want)
    on_1 = sum(cache.owner(i) == 1 for i in range(len(ds)))
    nodes[1].stop()
    nodes[1].start()
    nodes[1].client().config_set("maxmemory-policy", "allkeys-lru")
    before = loader.stats()
    _check_epoch(loader, want)
    got = counts_delta(before, loader.stats(), _COUNTS)
    assert got == {"storage_reads": on_1, "local_hits": len(ds) - on_1, "remote_hits": 0, "remote_errors": 1}
    # restarted: empty, and nothing written since
    assert loader.stats()["nodes_down"] == 1 and nodes[1].client().dbsize() == 0
    cache.close()


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_nodes_down_counts_what_worker_processes_saw(redis_nodes, tiny_root, start):
    nodes = [redis_nodes() for _ in range(2)]
    ds = coordl.ImageFolder(tiny_root, transform="val", size=SIZE)
    want = _files(ds)
    cache = PartitionedCache([n.url for n in nodes], 1, retry_after=3600.0)
    loader = _loader(ds, cache, workers=2, multiprocessing_context=start)
    nodes[0].stop()
    _check_epoch(loader, want)
    stats = loader.stats()
    assert stats["nodes_down"] == 1 and stats["node_faults"] >= 1 and stats["remote_errors"] >= 1
    assert stats["storage_reads"] == len(ds)
    del loader
    cache.close()
