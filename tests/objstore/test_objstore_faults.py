"""cache/storage/objstore.py when the store misbehaves: missing bucket or prefix, an object deleted after
listing, injected 503 SlowDown (retried and counted; retries exhausted), a store that stops
answering, and the server killed mid-read. Counts, not clocks: the only time bound is the
issue's "a clear error within 60 s" (pytest-timeout catches a hang)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from coordl.cache.storage.objstore import ObjectStore
from coordl.errors import DatasetError, SampleError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import BUCKET, PREFIX, make_s3_dataset, objstore_proxy, s3server  # noqa: E402


def test_missing_bucket_is_named_at_construction(s3):
    with pytest.raises(DatasetError, match=r"s3://nope/train: bucket 'nope' does not exist"):
        ObjectStore.from_url("s3://nope/train", s3.options())


def test_missing_prefix_is_named_at_construction(s3):
    with pytest.raises(DatasetError, match=r"s3://data/nothere: no objects under prefix 'nothere' in bucket 'data'"):
        ObjectStore.from_url("s3://data/nothere", s3.options())


def test_unreachable_endpoint_is_named_at_construction(s3):
    port = s3server.free_port()  # nothing listens there
    with pytest.raises(DatasetError, match=rf"s3://data/train: listing failed after 2 attempt\(s\).*127.0.0.1:{port}"):
        ObjectStore.from_url(s3.url, s3.options(endpoint_url=f"http://127.0.0.1:{port}"), retries=1)


def test_object_deleted_after_listing_names_its_url(s3):
    store = ObjectStore.from_url(s3.url, s3.options())
    keys = [o.key for o in store.list_tree()]
    gone = keys[3]
    client = s3.server.client()
    client.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{gone}")
    try:
        with pytest.raises(SampleError, match=rf"s3://data/train/{gone}: GET failed after 1 attempt.*deleted"):
            store.read_many(keys)
        got = store.read_many(keys, return_errors=True)
        assert isinstance(got[3], SampleError) and str(gone) in str(got[3])
        assert [g for i, g in enumerate(got) if i != 3] == [s3.local_bytes(k) for i, k in enumerate(keys) if i != 3]
    finally:
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{gone}", Body=s3.local_bytes(gone))
        store.close()


@pytest.mark.parametrize("client", ["s3fs", "obstore"])
def test_injected_503s_are_retried_counted_and_succeed(s3, proxy, client):
    if client == "obstore":
        pytest.importorskip("obstore")
    store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url), fetch_client=client)
    assert store.fetch_client == client, store.fetch_client_reason
    proxy.reset_counts()
    proxy.inject(503, 3)
    assert store.read_many(s3.keys) == [s3.local_bytes(k) for k in s3.keys]
    assert proxy.counts["GET"] == len(s3.keys) + 3
    stats = store.stats()
    assert (stats["gets"], stats["retries"], stats["objects"]) == (len(s3.keys) + 3, 3, len(s3.keys))
    store.close()


def test_503s_past_the_retries_raise_sample_error(s3, proxy):
    store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url), retries=2)
    proxy.reset_counts()
    proxy.inject(503, 3)
    key = s3.keys[0]
    with pytest.raises(SampleError, match=rf"s3://data/train/{key}: GET failed after 3 attempt\(s\).*throttling"):
        store.read(key)
    assert proxy.counts["GET"] == 3
    assert store.stats()["retries"] == 2
    store.close()


def test_a_store_that_stops_answering_times_out(s3, proxy):
    store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url), timeout=1.0, retries=1)
    proxy.reset_counts()
    proxy.hang = True
    with pytest.raises(SampleError, match=r"GET failed after 2 attempt\(s\) \(TimeoutError: no answer within "
                                          r"timeout=1.0 s\)"):
        store.read_many(s3.keys[:4])
    assert proxy.counts["GET"] >= 2  # the 4 first attempts (in flight together) and one retry at least
    store.close()


def test_server_killed_mid_read_fails_within_a_minute(s3, tiny_root, tmp_path_factory):
    """Its own server, SIGKILLed while a read_many of 42 objects (latency 50 ms, 4 in flight) runs:
    the default timeout and retries end it with a SampleError naming an object and the endpoint."""
    server = s3server.MotoServer().start()
    proxy = objstore_proxy.FaultProxy(server.url, latency=0.05).start()
    try:
        data = make_s3_dataset(server, tiny_root, tmp_path_factory)
        store = ObjectStore.from_url(data.url, data.options(endpoint_url=proxy.url), max_in_flight=4)
        outcome: list = []

        def read():
            try:
                outcome.append(store.read_many(data.keys))
            except SampleError as e:
                outcome.append(e)

        proxy.reset_counts()
        reader = threading.Thread(target=read)
        reader.start()
        while proxy.counts["GET"] < 8 and reader.is_alive():
            time.sleep(0.01)
        server.kill()
        killed = time.monotonic()
        reader.join(timeout=90)
        assert not reader.is_alive()
        assert time.monotonic() - killed < 60
        assert isinstance(outcome[0], SampleError), outcome[0]
        assert "s3://data/train/" in str(outcome[0]) and "unreachable" in str(outcome[0])
        assert store.stats()["objects"] < len(data.keys)
        store.close()
    finally:
        proxy.stop()
        server.stop()
