"""WebDataset's read-ahead over shards in a bucket (a real moto server of this module, GETs counted at a
proxy; the shards and fixtures of test_webdataset_s3.py): a batch's ranged GETs start while the same
worker prepares the batch before it (`EpochBatch.ahead`), and that batch takes them. Batches are
byte-identical with it on, off and over the local shards; every epoch GETs each item once (max_gap=0:
one ranged GET per item) and counts it once; a half-size MinIO cache's items are never read ahead; an
epoch left early or resumed costs at most one batch per worker of GETs nobody takes, never counted.
`storage_requests` / `storage_retries` equal the GETs (injected 503s included) the proxy saw.
Counts, not clocks."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import sys
import threading

import pytest
import torch

import coordl
from coordl.cache.storage import tarindex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_webdataset_s3 as wds  # noqa: E402
from coordl_tests_loaderhelp import batches_of, counts_delta

N = wds.N
shards, proxy = wds.shards, wds.proxy  # that module's fixtures: the shards on this module's moto server, a proxy

B = 4  # 40 items: 10 batches


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def _remote(shards, proxy, tmp_path, **options) -> coordl.WebDataset:
    options.setdefault("read_ahead", True)  # on whatever the client (default: with obstore only)
    options.setdefault("max_gap", 0)  # one ranged GET per item: GETs count items
    return coordl.WebDataset(shards.url, transform="train", size=24, seed=3, index_cache=str(tmp_path),
                             storage_options=shards.options(endpoint_url=proxy.url), **options)


def _readers() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("coordl-read"))


def test_read_ahead_is_checked_as_imagefolder_checks_it(shards, proxy, tmp_path):
    with pytest.raises(coordl.ConfigError, match=r"read_ahead='yes' must be True, False or None"):
        _remote(shards, proxy, tmp_path, read_ahead="yes")
    local = coordl.WebDataset(shards.pattern, transform="val", size=24, index_cache="off", read_ahead=True)
    assert local.ranged is None  # local shards: no effect
    assert len(batches_of(coordl.DataLoader(local, batch_size=B))) == N // B


@pytest.mark.parametrize("client, reads_ahead", [("obstore", True), ("s3fs", False)])
def test_by_default_only_obstore_reads_ahead(shards, proxy, tmp_path, client, reads_ahead):
    pytest.importorskip("obstore")
    ds = _remote(shards, proxy, tmp_path, read_ahead=None, fetch_client=client)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True)
    proxy.reset_counts()
    it = iter(loader)
    next(it)
    assert (loader.dataset.ranged._ahead is not None) == reads_ahead
    for _ in it:
        pass
    assert loader.stats()["storage_reads"] == proxy.counts["GET"] == N


def test_in_one_process_the_next_batch_is_read_ahead_and_taken(shards, proxy, tmp_path):
    ds = _remote(shards, proxy, tmp_path)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True)
    for epoch in range(2):
        order = loader.epoch_indices(epoch)
        proxy.reset_counts()
        before = loader.stats()
        it = iter(loader)
        next(it)
        held = loader.dataset.ranged._ahead
        assert held is not None and held.key == (epoch, tuple(order[B:2 * B]))
        for _ in it:
            pass
        assert loader.dataset.ranged._ahead is None  # nothing past the epoch's end
        counts = counts_delta(before, loader.stats())
        assert proxy.counts["GET"] == counts["storage_reads"] == counts["storage_requests"] == N
        assert counts["storage_bytes"] == ds.index.total_bytes
    assert _readers() <= 4  # this process's one reader pool (sources.reader_pool), whatever the epochs
    off = coordl.DataLoader(_remote(shards, proxy, tmp_path, read_ahead=False), batch_size=B, shuffle=True)
    it = iter(off)
    next(it)
    assert off.dataset.ranged._ahead is None
    del it


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("max_gap", [0, tarindex.MAX_GAP])
def test_two_workers_get_each_item_once_per_epoch_and_the_same_batches(shards, proxy, tmp_path, persistent,
                                                                       max_gap):
    """max_gap=0: one GET per item; the default: a batch's neighbours in one GET, as with it off."""
    proxy.latency = 0.005  # GETs still in flight when their batch takes them
    ds = _remote(shards, proxy, tmp_path, max_gap=max_gap)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, persistent_workers=persistent)
    off = coordl.DataLoader(_remote(shards, proxy, tmp_path, max_gap=max_gap, read_ahead=False), batch_size=B,
                            shuffle=True, num_workers=2)
    local = coordl.DataLoader(coordl.WebDataset(shards.pattern, transform="train", size=24, seed=3, index_cache="off"),
                              batch_size=B, shuffle=True)
    for _ in range(2):
        proxy.reset_counts()
        before = loader.stats()
        got = batches_of(loader)
        counts = counts_delta(before, loader.stats())
        gets = proxy.counts["GET"]
        proxy.reset_counts()
        before_off = off.stats()
        want = batches_of(off)
        counts_off = counts_delta(before_off, off.stats())
        assert counts["samples"] == N and gets == counts["storage_reads"]
        assert (counts["storage_reads"], counts["storage_bytes"]) == (counts_off["storage_reads"],
                                                                      counts_off["storage_bytes"])
        assert proxy.counts["GET"] == counts_off["storage_reads"]
        if max_gap == 0:
            assert gets == N and counts["storage_bytes"] == ds.index.total_bytes
        assert _same(got, want) and _same(got, batches_of(local))


@pytest.mark.parametrize("read_ahead", [False, True])
@pytest.mark.parametrize("max_gap", [0, tarindex.MAX_GAP])
def test_storage_requests_are_the_gets_the_store_saw(shards, proxy, tmp_path, read_ahead, max_gap):
    """Two workers, two epochs: each epoch's storage_requests equal the proxy's GETs (no retry: as many
    as storage_reads), the coalesced ranged GETs of max_gap too."""
    proxy.latency = 0.005
    ds = _remote(shards, proxy, tmp_path, max_gap=max_gap, read_ahead=read_ahead)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2)
    for _ in range(2):
        proxy.reset_counts()
        before = loader.stats()
        assert len(batches_of(loader)) == N // B
        counts = counts_delta(before, loader.stats())
        assert counts["storage_requests"] == counts["storage_reads"] == proxy.counts["GET"] > 0
        assert counts["storage_retries"] == 0
        if max_gap == 0:
            assert proxy.counts["GET"] == N


@pytest.mark.parametrize("read_ahead", [False, True])
def test_injected_503s_are_counted_as_requests_and_retries(shards, proxy, tmp_path, read_ahead):
    """3 injected 503s (the store's retries=3: no range can run out of them, whichever GETs they hit):
    storage_retries == 3 and storage_requests == the proxy's GETs == the reads + 3; a clean epoch after
    adds no retry."""
    ds = _remote(shards, proxy, tmp_path, max_gap=tarindex.MAX_GAP, read_ahead=read_ahead)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2)
    proxy.reset_counts()
    proxy.inject(503, 3)
    before = loader.stats()
    got = batches_of(loader)
    counts = counts_delta(before, loader.stats())
    assert counts["samples"] == N and counts["storage_retries"] == 3
    assert counts["storage_requests"] == proxy.counts["GET"] == counts["storage_reads"] + 3
    local = coordl.WebDataset(shards.pattern, transform="train", size=24, seed=3, index_cache="off")
    assert _same(got, batches_of(coordl.DataLoader(local, batch_size=B, shuffle=True)))  # retried GETs, same bytes
    proxy.reset_counts()
    before = loader.stats()
    batches_of(loader)
    counts = counts_delta(before, loader.stats())
    assert counts["storage_retries"] == 0
    assert counts["storage_requests"] == proxy.counts["GET"] == counts["storage_reads"]


def test_half_size_minio_cache_items_are_never_read_ahead(shards, proxy, tmp_path, dropped):
    proxy.latency = 0.005
    ds = _remote(shards, proxy, tmp_path)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2, persistent_workers=True,
                               cache=ds.index.total_bytes // 2)
    dropped.append(loader.dataset)
    proxy.reset_counts()
    before = loader.stats()
    for _ in loader:
        pass
    first = counts_delta(before, loader.stats())
    assert proxy.counts["GET"] == first["storage_reads"] == N
    held = first["cache_inserts"]
    assert 0 < held < N and first["cache_hits"] + first["cache_misses"] == N
    for _ in range(2):
        proxy.reset_counts()
        before = loader.stats()
        for _ in loader:
            pass
        later = counts_delta(before, loader.stats())
        assert (later["cache_hits"], later["cache_misses"], later["samples"]) == (held, N - held, N)  # once each
        assert proxy.counts["GET"] == later["storage_reads"] == N - held


def test_a_resumed_epoch_gets_only_its_rest(shards, proxy, tmp_path):
    ds = _remote(shards, proxy, tmp_path)
    loader = coordl.DataLoader(ds, batch_size=B, shuffle=True, num_workers=2)
    full = batches_of(loader)
    loader.set_epoch(0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    gc.collect()
    again = coordl.DataLoader(_remote(shards, proxy, tmp_path), batch_size=B, shuffle=True, num_workers=2)
    again.load_state_dict(state)
    proxy.reset_counts()
    rest = batches_of(again)
    assert _same(rest, full[3:])
    assert proxy.counts["GET"] == again.stats()["storage_reads"] == again.stats()["storage_requests"] == N - 3 * B


@pytest.mark.parametrize("persistent", [False, True])
def test_an_epoch_left_early_costs_at_most_one_batch_ahead_per_worker(shards, proxy, tmp_path, persistent):
    """After 2 of 10 batches received, torch has sent 2 + prefetch_factor * workers = 6 batches to the
    workers; read-ahead may add each worker's next one (batches 6 and 7), never counted in stats."""
    proxy.latency = 0.005
    ds = _remote(shards, proxy, tmp_path)
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
    assert len(got) == N // B
    gets = proxy.counts["GET"]
    if persistent:  # the new epoch's iter() lets the workers finish the 6 batches sent (torch's _reset)
        assert total["storage_reads"] == total["storage_requests"] == sent + N  # the dropped batches' GETs: not
        assert sent + N <= gets <= sent + ahead + N
    else:  # the workers were stopped and joined: the new epoch is exact
        assert (counts["storage_reads"], counts["storage_bytes"]) == (N, ds.index.total_bytes)
        assert (counts["storage_requests"], counts["storage_retries"]) == (N, 0)
        assert 2 * B + N <= gets <= sent + ahead + N


def test_a_batch_and_the_one_ahead_share_the_processs_bound(shards, proxy):
    """Two read_ranges at once in one process (a batch's and the next one's): at most max_in_flight GETs."""
    from coordl.cache.storage.objstore import ObjectStore

    store = ObjectStore.from_url(f"s3://{wds.BUCKET}/{wds.PREFIX}", shards.options(endpoint_url=proxy.url),
                                 max_in_flight=3)
    try:
        with open(shards.local[0], "rb") as f:
            local = f.read()
        ranges = [("train-000000.tar", off, 700) for off in range(0, 20 * 512, 512)]
        proxy.latency, proxy.max_in_flight = 0.02, 0
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            got = list(pool.map(store.read_ranges, [ranges, ranges]))
        assert got == [[local[off:off + 700] for _, off, _ in ranges]] * 2
        assert proxy.max_in_flight == 3 and store.stats()["gets"] == 40
    finally:
        store.close()
