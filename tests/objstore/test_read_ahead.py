"""ImageFolder's read-ahead over s3:// (a real moto server of this module, GETs counted at a proxy):
each batch carries the same worker's next batch (`EpochBatch.ahead`), whose misses' GETs start early
and are taken by that batch. Every epoch still GETs each item once, batches are byte-identical with it
on or off, an epoch left early costs at most one batch per worker of GETs nobody takes (never counted
in stats), and a cached item is never read ahead. Counts, not clocks."""

from __future__ import annotations

import gc
import pickle

import pytest
import torch
from coordl_tests_loaderhelp import batches_of, counts_delta

import coordl
from coordl.epochs.sampling import EpochBatch, with_ahead

B = 4  # the batch size: the 42 objects of the module's dataset make 11 batches


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def _remote(s3, proxy, **options) -> coordl.ImageFolder:
    options.setdefault("read_ahead", True)  # on whatever the client (default: with obstore only)
    return coordl.ImageFolder(s3.url, transform="train", size=24, seed=3,
                              storage_options=s3.options(endpoint_url=proxy.url), **options)


@pytest.mark.parametrize("client, reads_ahead", [("obstore", True), ("s3fs", False)])
def test_by_default_only_obstore_reads_ahead(s3, proxy, client, reads_ahead):
    pytest.importorskip("obstore")
    ds = _remote(s3, proxy, read_ahead=None, fetch_client=client)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True)
    it = iter(loader)
    next(it)
    assert (loader.dataset.objects._ahead is not None) == reads_ahead
    for _ in it:
        pass
    assert loader.stats()["storage_reads"] == len(ds)


def test_with_ahead_pairs_each_batch_with_the_one_stride_later():
    assert list(with_ahead([[0], [1], [2], [3], [4]], 2)) == [([0], [2]), ([1], [3]), ([2], [4]), ([3], None),
                                                              ([4], None)]
    assert list(with_ahead([[0]], 2)) == [([0], None)]
    batch = pickle.loads(pickle.dumps(EpochBatch([3, 1], 7, [5, 2])))
    assert (list(batch), batch.epoch, batch.ahead) == ([3, 1], 7, [5, 2])
    assert pickle.loads(pickle.dumps(EpochBatch([3], 1))).ahead is None


@pytest.mark.parametrize("workers", [0, 2])
def test_each_batch_carries_the_same_workers_next_one(s3, workers):
    ds = coordl.ImageFolder(s3.root, transform="val", size=24)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=workers)
    stride = max(1, workers)
    batches = list(loader._index_sampler)
    assert len(batches) == -(-len(ds) // B)
    for k, batch in enumerate(batches):
        ahead = list(batches[k + stride]) if k + stride < len(batches) else None
        assert (batch.epoch, batch.ahead) == (loader.epoch, ahead)
    # a batch sampler of anyone else's: no `ahead`
    own = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), B, False)
    other = coordl.DataLoader(ds, batch_sampler=own, num_workers=workers)
    assert all(b.ahead is None for b in other._index_sampler)


def test_in_one_process_the_next_batch_is_read_ahead_and_taken(s3, proxy):
    ds = _remote(s3, proxy)
    n = len(ds)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True)
    order = loader.epoch_indices(0)
    proxy.reset_counts()
    it = iter(loader)
    next(it)
    held = loader.dataset.objects._ahead
    assert held is not None and held.key == (0, tuple(order[B:2 * B]))
    for _ in it:
        pass
    assert loader.dataset.objects._ahead is None  # nothing past the epoch's end
    stats = loader.stats()
    assert proxy.counts["GET"] == n
    assert (stats["storage_reads"], stats["storage_requests"]) == (n, n)
    assert stats["storage_bytes"] == ds.manifest.total_bytes
    off = coordl.DataLoader(_remote(s3, proxy, read_ahead=False), batch_size=B, shuffle=True)
    it = iter(off)
    next(it)
    assert off.dataset.objects._ahead is None
    del it


@pytest.mark.parametrize("persistent", [False, True])
def test_two_workers_get_each_item_once_per_epoch_and_the_same_batches(s3, proxy, persistent):
    proxy.latency = 0.005  # GETs still in flight when their batch takes them
    ds = _remote(s3, proxy)
    n = len(ds)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, persistent_workers=persistent)
    off = coordl.DataLoader(_remote(s3, proxy, read_ahead=False), batch_size=B, shuffle=True, num_workers=2)
    local = coordl.DataLoader(coordl.ImageFolder(s3.root, transform="train", size=24, seed=3), batch_size=B,
                              shuffle=True)
    for _ in range(2):
        proxy.reset_counts()
        before = loader.stats()
        got = batches_of(loader)
        counts = counts_delta(before, loader.stats())
        assert proxy.counts["GET"] == n
        assert (counts["storage_reads"], counts["storage_requests"], counts["storage_retries"]) == (n, n, 0)
        assert counts["storage_bytes"] == ds.manifest.total_bytes
        assert _same(got, batches_of(off)) and _same(got, batches_of(local))


def test_a_resumed_epoch_gets_only_its_rest(s3, proxy):
    ds = _remote(s3, proxy)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2)
    full = batches_of(loader)
    loader.set_epoch(0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    gc.collect()
    again = coordl.DataLoader(_remote(s3, proxy), batch_size=B, shuffle=True, num_workers=2)
    again.load_state_dict(state)
    proxy.reset_counts()
    rest = batches_of(again)
    assert _same(rest, full[3:])
    items = len(ds) - 3 * B
    assert proxy.counts["GET"] == again.stats()["storage_reads"] == again.stats()["storage_requests"] == items


@pytest.mark.parametrize("persistent", [False, True])
def test_an_epoch_left_early_costs_at_most_one_batch_ahead_per_worker(s3, proxy, persistent):
    """After 2 of 11 batches received, torch has sent 2 + prefetch_factor * workers = 6 batches to the
    workers; read-ahead may add each worker's next one (batches 6 and 7), never counted in stats."""
    proxy.latency = 0.005
    ds = _remote(s3, proxy)
    n = len(ds)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, persistent_workers=persistent)
    sent, ahead = 6 * B, 2 * B
    proxy.reset_counts()
    it = iter(loader)
    for _ in range(2):
        next(it)
    del it
    gc.collect()  # non-persistent: the workers are joined, their counts final
    middle = loader.stats()
    got = batches_of(loader)
    counts = counts_delta(middle, loader.stats())
    total = loader.stats()
    assert len(got) == -(-n // B)
    gets = proxy.counts["GET"]
    if persistent:  # the new epoch's iter() lets the workers finish the 6 batches sent (torch's _reset)
        assert total["storage_reads"] == total["storage_requests"] == sent + n
        assert sent + n <= gets <= sent + ahead + n
    else:  # the workers were stopped and joined: the new epoch is exact
        assert (counts["storage_reads"], counts["storage_requests"]) == (n, n)
        assert counts["storage_bytes"] == ds.manifest.total_bytes
        assert 2 * B + n <= gets <= sent + ahead + n
    assert total["storage_retries"] == 0


def test_half_size_minio_cache_items_are_never_read_ahead(s3, proxy, dropped):
    ds = _remote(s3, proxy)
    n = len(ds)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, persistent_workers=True,
                               cache=ds.manifest.total_bytes // 2)
    dropped.append(loader.dataset)
    proxy.reset_counts()
    before = loader.stats()
    for _ in loader:
        pass
    first = counts_delta(before, loader.stats())
    assert proxy.counts["GET"] == first["storage_reads"] == first["storage_requests"] == n
    held = first["cache_inserts"]
    assert 0 < held < n and first["cache_hits"] + first["cache_misses"] == n
    proxy.reset_counts()
    before = loader.stats()
    for _ in loader:
        pass
    second = counts_delta(before, loader.stats())
    assert (second["cache_hits"], second["cache_misses"]) == (held, n - held)  # each item looked up once
    assert proxy.counts["GET"] == second["storage_reads"] == second["storage_requests"] == n - held
