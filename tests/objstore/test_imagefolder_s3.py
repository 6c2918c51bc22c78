"""coordl.ImageFolder over s3:// (a real moto server of this module): the listing equals a local copy's,
the manifest is persisted by URL, batches are byte for byte the local ones, a half-size MinIO cache
saves exactly the GETs it holds, and the faults (missing bucket, deleted object, 503s, the server
killed mid-epoch) end in coordl errors naming the URL. Counts, not clocks."""

from __future__ import annotations

import gc
import os
import sys
import time

import pytest
import torch

import coordl
from coordl.errors import DatasetError, SampleError
from coordl.manifest import objects

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coordl_tests_loaderhelp import batches_of, epoch_counts
from objstore_common import BUCKET, PREFIX, local_walk, make_s3_dataset, objstore_proxy, s3server  # noqa: E402


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_listing_matches_a_local_copy_and_keeps_no_secret(s3, tmp_path):
    ds = coordl.ImageFolder(s3.url, storage_options=s3.options(), manifest_cache=str(tmp_path))
    local = coordl.ImageFolder(s3.root, manifest_cache="off")
    assert (ds.classes, ds.class_to_idx, ds.targets, len(ds)) == (local.classes, local.class_to_idx,
                                                                 local.targets, len(local))
    m = ds.manifest
    assert [(m.relpath(i), int(m.sizes[i])) for i in range(len(m))] == local_walk(s3.root)
    assert ds.samples == [(f"{s3.url}/{rel}", label) for (rel, _), label in zip(local_walk(s3.root), local.targets)]
    assert not m.mtimes.any() and ds.root == s3.url
    secret = s3.options()["secret"]
    shown = repr(ds) + repr(ds.objects) + str(ds.samples)
    saved = b"".join(open(os.path.join(tmp_path, f), "rb").read() for f in os.listdir(tmp_path))
    assert secret not in shown and secret.encode() not in saved and s3.url.encode() in saved


def test_manifest_persisted_by_url_reused_when_unchanged_rebuilt_when_not(s3, tmp_path):
    opts, cache = s3.options(), str(tmp_path)
    first = coordl.ImageFolder(s3.url, storage_options=opts, manifest_cache=cache)
    before = dict(objects.LISTS)
    again = coordl.ImageFolder(s3.url, storage_options=opts, manifest_cache=cache)
    assert objects.LISTS["lists"] == before["lists"] + 1 and objects.LISTS["reused"] == before["reused"] + 1
    assert again.manifest.source.startswith(cache) and again.fingerprint == first.fingerprint
    assert again.samples == first.samples
    forced = coordl.ImageFolder(s3.url, storage_options=opts, manifest_cache=cache, rescan=True)
    assert forced.manifest.source == "scan" and forced.fingerprint == first.fingerprint
    client, extra = s3.server.client(), f"{PREFIX}/class_0002/zz_new.jpg"
    client.put_object(Bucket=BUCKET, Key=extra, Body=s3.local_bytes(s3.keys[0]))
    try:
        changed = coordl.ImageFolder(s3.url, storage_options=opts, manifest_cache=cache)
        assert changed.manifest.source == "scan" and len(changed) == len(first) + 1
        assert changed.fingerprint != first.fingerprint
    finally:
        client.delete_object(Bucket=BUCKET, Key=extra)


def test_batches_are_byte_identical_to_the_local_copy(s3):
    ds = coordl.ImageFolder(s3.url, transform="train", size=32, seed=3, storage_options=s3.options())
    local = coordl.ImageFolder(s3.root, transform="train", size=32, seed=3)
    remote_loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
    local_loader = coordl.DataLoader(local, batch_size=8, shuffle=True, num_workers=2)
    for _ in range(2):
        assert _same(batches_of(remote_loader), batches_of(local_loader))
    stats = remote_loader.stats()
    assert stats["storage_reads"] == 2 * len(ds)
    assert stats["storage_bytes"] == 2 * ds.manifest.total_bytes


def test_half_size_minio_cache_saves_exactly_the_gets_it_holds(s3, proxy, dropped):
    ds = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=s3.options(endpoint_url=proxy.url))
    n = len(ds)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, cache=ds.manifest.total_bytes // 2)
    dropped.append(loader.dataset)
    proxy.reset_counts()
    first = epoch_counts(loader)
    assert proxy.counts["GET"] == first["storage_reads"] == n
    held = first["cache_inserts"]
    assert 0 < held < n
    proxy.reset_counts()
    second = epoch_counts(loader)
    assert second["cache_hits"] == held and second["storage_reads"] == n - held
    assert proxy.counts["GET"] == n - held


def test_missing_bucket_is_named_at_construction(s3):
    with pytest.raises(DatasetError, match=r"s3://nope/train: bucket 'nope' does not exist"):
        coordl.ImageFolder("s3://nope/train", storage_options=s3.options())


def test_object_deleted_after_listing_names_its_url_or_is_skipped(s3):
    opts = s3.options()
    strict = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=opts)
    lenient = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=opts, on_error="skip")
    gone = strict.manifest.relpath(5)
    client = s3.server.client()
    client.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{gone}")
    try:
        with pytest.raises(SampleError, match=rf"s3://data/train/{gone}: GET failed .*deleted"):
            batches_of(coordl.DataLoader(strict, batch_size=8, num_workers=2))
        gc.collect()  # the failed loader's workers end with it (its error's traceback held it in a cycle)
        loader = coordl.DataLoader(lenient, batch_size=8, num_workers=2)
        for _ in range(2):
            counts = epoch_counts(loader)
            assert (counts["errors_skipped"], counts["samples"]) == (1, len(lenient) - 1)
    finally:
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{gone}", Body=s3.local_bytes(gone))


def test_injected_503s_are_retried(s3, proxy):
    ds = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=s3.options(endpoint_url=proxy.url))
    local = coordl.ImageFolder(s3.root, transform="val", size=32)
    proxy.reset_counts()
    proxy.inject(503, 5)
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=2)
    assert _same(batches_of(loader), batches_of(coordl.DataLoader(local, batch_size=8)))
    assert proxy.counts["GET"] == len(ds) + 5 and loader.stats()["storage_reads"] == len(ds)


def test_server_killed_mid_epoch_is_a_clear_error_within_a_minute(s3, tiny_root, tmp_path_factory):
    """Its own server, SIGKILLed after the first batch: SampleError naming an object's URL and the
    endpoint, well inside 60 s (the autouse no_leaks checks /dev/shm and the process tree)."""
    server = s3server.MotoServer().start()
    proxy = objstore_proxy.FaultProxy(server.url, latency=0.02).start()
    try:
        data = make_s3_dataset(server, tiny_root, tmp_path_factory)
        ds = coordl.ImageFolder(data.url, transform="val", size=32,
                                storage_options=data.options(endpoint_url=proxy.url))
        killed_mid_epoch_fails_within_a_minute(ds, server, "s3://data/train")
    finally:
        proxy.stop()
        server.stop()


def killed_mid_epoch_fails_within_a_minute(ds, server, url: str) -> None:
    """A 2-worker loader over `ds`, `server` SIGKILLed after its first batch: the epoch ends with a
    SampleError naming an object below `url` as unreachable, within 60 s of the kill."""
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=1)
    it = iter(loader)
    next(it)
    server.kill()
    killed = time.monotonic()
    with pytest.raises(SampleError, match=rf"{url}/.*unreachable"):
        for _ in it:
            pass
    assert time.monotonic() - killed < 60
    del it, loader
    gc.collect()  # the caught error's traceback holds the iterator in a cycle; its workers end with it


def test_ranks_and_resume_on_s3_match_the_local_copy(s3):
    def build(root: str, rank: int = 0, world: int = 1, **options):
        ds = coordl.ImageFolder(root, transform="train", size=24, seed=5, **options)
        return coordl.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, rank=rank, world_size=world)

    opts = {"storage_options": s3.options()}
    counts = []
    for r in range(2):
        remote = build(s3.url, r, 2, **opts)
        assert _same(batches_of(remote), batches_of(build(s3.root, r, 2)))
        counts.append(remote.stats()["samples"])
    n = len(build(s3.root).dataset)
    assert counts[0] == counts[1] == -(-n // 2)  # each rank its half, padded as torch's DistributedSampler

    reference = build(s3.url, **opts)
    epochs = [batches_of(reference) for _ in range(2)]
    loader = build(s3.url, **opts)
    batches_of(loader)
    it = iter(loader)
    got = [(x.clone(), y.clone()) for x, y in (next(it) for _ in range(4))]
    assert _same(got, epochs[1][:4])
    state = loader.state_dict()
    del it, loader
    fresh = build(s3.url, **opts)
    fresh.load_state_dict(state)
    assert _same(batches_of(fresh), epochs[1][4:])
