"""Acceptance of partitioned caching: 3 real redis-servers, 3 node processes in lockstep epochs.

Each node process runs `coordl.DataLoader(ds, rank=r, world_size=3, cache=coordl.PartitionedCache(...))`
over a real JPEG folder whose bytes fit the three nodes' budgets together but not one node's. The test
process drives the epochs (one command per epoch, optionally a pause after a given batch so that a
server can be stopped mid-epoch) and stops/starts the servers between commands.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import traceback

import numpy as np
import pytest

import coordl
from coordl.cache.checksum import digest
from coordl.cache.partitioned import cache as partitioned
from coordl.cache.partitioned import placement, redisnode
from coordl.cli.make_dataset import make_dataset
from coordl.epochs.sampling import epoch_order, rank_share
from coordl.loader.partitioned import PartitionedCache
from coordl.pipelines import cpu

WORLD = 3
BATCH = 5
ITEMS = 60          # divisible by WORLD: the shares are then an exact partition (no padding)
SIZE = 48


class Recording(coordl.ImageFolder):
    """ImageFolder that records the digest of the raw bytes of every item it preps (num_workers=0)."""

    seen: list[tuple[int, int]] = []

    def prep_into(self, raw, i, epoch, out):
        Recording.seen.append((int(i), digest(raw)))
        return super().prep_into(raw, i, epoch, out)


@pytest.fixture(scope="module")
def jpeg_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("partitioned"))
    make_dataset(root, images=ITEMS, classes=3, size=(256, 192), quality=90, seed=12, workers=1, progress=False)
    return root


@pytest.fixture
def root(jpeg_root, tmp_path) -> str:
    """A copy with fresh mtimes: a fingerprint of this test alone."""
    path = str(tmp_path / "data")
    shutil.copytree(jpeg_root, path, copy_function=shutil.copy)
    return path


def _node(rank, urls, root, cap, workers, cmds, results) -> None:
    try:
        ds = Recording(root, transform="val", size=SIZE)
        files = [open(ds.manifest.path(i), "rb").read() for i in range(len(ds))]
        want = {i: cpu.val(raw, SIZE) for i, raw in enumerate(files)}
        # read_ahead off: a node stopped mid-epoch must not have answered the next batch already
        cache = PartitionedCache(urls, rank, capacity_per_node=cap, timeout=5.0, retry_after=0.0, read_ahead=False)
        loader = coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers,
                                   persistent_workers=workers > 0, rank=rank, world_size=WORLD, cache=cache)
        results.put(("ready", rank, len(loader)))
        epoch = 0
        while (cmd := cmds.get())[0] == "epoch":
            pause_after = cmd[1]
            before = loader.stats()
            Recording.seen.clear()
            share = rank_share(epoch_order(len(ds), ds.seed, epoch), rank, WORLD)
            epoch += 1
            got: list[int] = []
            for b, (images, _labels) in enumerate(loader):
                expect = share[b * BATCH:(b + 1) * BATCH].tolist()
                for row, i in enumerate(expect):
                    if not np.array_equal(images[row].permute(1, 2, 0).numpy(), want[i]):
                        raise AssertionError(f"rank {rank}: batch {b} row {row} is not item {i}")
                got += expect
                if pause_after is not None and b + 1 == pause_after:
                    results.put(("paused", rank, None))
                    cmds.get()
            after = loader.stats()
            if workers == 0:
                assert [i for i, _ in Recording.seen] == got
                bad = [i for i, d in Recording.seen if d != digest(files[i])]
                assert not bad, f"rank {rank}: raw bytes differ from the files of items {bad}"
            results.put(("epoch", rank, {"items": got, **{k: after[k] - before[k] for k in before},
                                         "cache_items": after["cache_items"]}))
        cache.close()
        results.put(("done", rank, None))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
        raise


class Cluster:
    """3 redis-servers and 3 node processes; `epoch()` runs one lockstep epoch on every node."""

    def __init__(self, redis_nodes, root, workers=0):
        self.servers = [redis_nodes() for _ in range(WORLD)]
        self.urls = [s.url for s in self.servers]
        ds = coordl.ImageFolder(root, transform="val", size=SIZE)
        self.ds, self.n = ds, len(ds)
        sizes = np.array([ds.manifest.sizes[i] + partitioned.HEADER.size for i in range(self.n)])
        salts = placement.node_salts(ds.fingerprint, [redisnode.node_name(u) for u in self.urls])
        self.owner = placement.owners(salts, np.arange(self.n))
        owned = np.bincount(self.owner, weights=sizes, minlength=WORLD)
        # each node's budget: just its share (placement varies with the fingerprint and the ports:
        # the biggest share of 60 items is 35-45% of the bytes; above 60% has odds of ~1e-5)
        self.cap = int(owned.max()) + 1
        assert self.cap * WORLD >= sizes.sum() and self.cap < 0.6 * sizes.sum()   # fits all three, not one
        ctx = mp.get_context("fork")
        self.cmds = [ctx.Queue() for _ in range(WORLD)]
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=_node, args=(r, self.urls, root, self.cap, workers, self.cmds[r],
                                                      self.results)) for r in range(WORLD)]
        for p in self.procs:
            p.start()
        self.batches = self._wait("ready")
        self.epochs = 0

    def _wait(self, kind):
        out = {}
        while len(out) < WORLD:
            got, rank, value = self.results.get(timeout=120)
            if got == "error":
                raise AssertionError(f"node {rank} failed:\n{value}")
            assert got == kind, (got, kind)
            out[rank] = value
        return out

    def epoch(self, between=None, pause_after=None, during=None) -> dict[int, dict]:
        """One epoch on every node; `between()` runs before it starts, `during()` while every node
        waits after batch `pause_after`."""
        if between is not None:
            between()
        for q in self.cmds:
            q.put(("epoch", pause_after))
        if pause_after is not None:
            self._wait("paused")
            during()
            for q in self.cmds:
                q.put("go")
        out = self._wait("epoch")
        shares = [set(out[r]["items"]) for r in range(WORLD)]
        order = epoch_order(self.n, self.ds.seed, self.epochs)
        for r in range(WORLD):
            assert out[r]["items"] == rank_share(order, r, WORLD).tolist()
        assert set().union(*shares) == set(range(self.n))
        assert sum(map(len, shares)) == self.n                      # disjoint
        self.epochs += 1
        return out

    def close(self):
        for q in self.cmds:
            q.put(("stop", None))
        try:
            self._wait("done")
        finally:
            for p in self.procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
                    p.join()

    def total(self, out, key) -> int:
        return sum(out[r][key] for r in range(WORLD))

    def owned_by(self, j) -> int:
        return int(np.sum(self.owner == j))


@pytest.fixture
def cluster(redis_nodes, root, request):
    c = Cluster(redis_nodes, root, workers=getattr(request, "param", 0))
    yield c
    c.close()


def _sum_file_bytes(c) -> int:
    return int(sum(c.ds.manifest.sizes[i] for i in range(c.n)))


@pytest.mark.parametrize("cluster", [0, 2], indirect=True, ids=["in-process", "2-workers"])
def test_from_epoch_2_no_node_reads_storage(cluster):
    c = cluster
    first = c.epoch()
    assert c.total(first, "storage_reads") == c.n and c.total(first, "storage_bytes") == _sum_file_bytes(c)
    assert c.total(first, "cache_inserts") == c.n
    for _ in range(2):
        out = c.epoch()
        for r in range(WORLD):
            assert out[r]["storage_bytes"] == 0 and out[r]["storage_reads"] == 0
            mine = [i for i in out[r]["items"] if c.owner[i] == r]
            assert out[r]["local_hits"] == len(mine)
            assert out[r]["remote_hits"] == len(out[r]["items"]) - len(mine)
            assert out[r]["remote_bytes"] == sum(c.ds.manifest.sizes[i] for i in out[r]["items"] if c.owner[i] != r)
            assert out[r]["remote_errors"] == 0 and out[r]["cache_items"] == c.owned_by(r)


def test_a_server_stopped_between_epochs_then_restarted(cluster):
    c = cluster
    c.epoch()
    down = c.epoch(between=c.servers[1].stop)
    assert c.total(down, "storage_reads") == c.owned_by(1)          # exactly node 1's items, from storage
    assert c.total(down, "local_hits") + c.total(down, "remote_hits") == c.n - c.owned_by(1)
    assert all(down[r]["remote_errors"] >= 1 for r in range(WORLD))
    refill = c.epoch(between=c.servers[1].start)                     # same port, empty
    assert c.total(refill, "storage_reads") == c.owned_by(1)
    assert c.total(refill, "cache_inserts") == c.owned_by(1)
    back = c.epoch()
    assert back[1]["cache_items"] == c.owned_by(1)                  # (read when no node writes any more)
    assert c.total(back, "storage_bytes") == 0 and c.total(back, "remote_errors") == 0
    assert c.total(back, "local_hits") + c.total(back, "remote_hits") == c.n


def test_a_server_stopped_mid_epoch_then_restarted(cluster):
    c = cluster
    c.epoch()
    pause = 2
    mid = c.epoch(pause_after=pause, during=c.servers[2].stop)
    order = epoch_order(c.n, c.ds.seed, c.epochs - 1)
    rest = [i for r in range(WORLD) for i in rank_share(order, r, WORLD)[pause * BATCH:]]
    assert c.total(mid, "storage_reads") == sum(c.owner[i] == 2 for i in rest)
    assert c.total(mid, "storage_reads") > 0
    c.epoch(between=c.servers[2].start)
    back = c.epoch()
    assert c.total(back, "storage_bytes") == 0
    assert back[2]["local_hits"] == sum(c.owner[i] == 2 for i in back[2]["items"])


def test_spawned_workers_get_the_cache_by_pickle(redis_nodes, root):
    node = redis_nodes()
    ds = coordl.ImageFolder(root, transform="val", size=SIZE)
    cache = PartitionedCache([node.url], 0)
    loader = coordl.DataLoader(ds, batch_size=BATCH, num_workers=1, multiprocessing_context="spawn",
                               persistent_workers=True, cache=cache)
    first = [x.clone() for x, _ in loader]
    s1 = loader.stats()
    assert s1["storage_reads"] == ITEMS and s1["cache_inserts"] == ITEMS and s1["cache_items"] == ITEMS
    second = [x.clone() for x, _ in loader]
    s2 = loader.stats()
    assert s2["storage_bytes"] == s1["storage_bytes"] and s2["local_hits"] == ITEMS
    assert all(a.equal(b) for a, b in zip(first, second))
    del loader
    cache.close()
