"""s3:// listings page by page (cache/storage/listing.py): obstore's listing is exactly s3fs's (keys, sizes,
ETags, walk order, LIST requests) on moto and on the synthetic bucket (bench/lib/objstore_listing.py);
the root is listed once per construction; a LIST page that stalls past the timeout is retried alone
(the prefix resumes after its last key received). Counts, not clocks."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from coordl.cache.storage.objstore import ObjectStore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import objstore_proxy  # noqa: E402

pytest.importorskip("obstore")
CLIENTS = ("s3fs", "obstore")


def _tree(url: str, options: dict, client: str, **kw) -> tuple[list, dict]:
    store = ObjectStore.from_url(url, options, fetch_client=client, **kw)
    try:
        assert store.fetch_client == client, store.fetch_client_reason
        return store.list_tree(), store.stats()
    finally:
        store.close()


def test_obstore_lists_exactly_what_s3fs_lists_on_moto(s3, proxy):
    got = {}
    for client in CLIENTS:
        proxy.reset_counts()
        infos, stats = _tree(s3.url, s3.options(endpoint_url=proxy.url), client)
        # the root once (construction; list_tree's list_classes answers from it), one page per class
        got[client] = (infos, dict(proxy.counts), stats["lists"], stats["retries"])
    assert got["obstore"] == got["s3fs"]
    infos, counts, lists, _ = got["s3fs"]
    assert counts == {"GET": 1 + 4} and lists == 1 + 4 and len(infos) == len(s3.keys)
    assert sorted(o.key for o in infos) == sorted(s3.keys) and all(o.etag and '"' not in o.etag for o in infos)


@pytest.mark.parametrize("in_flight", [1, 8])
def test_obstore_lists_exactly_what_s3fs_lists_on_the_synthetic_bucket(static, listing, in_flight):
    """3001 objects in 3 prefixes (1001 + 1000 + 1000): the root's page + 2 + 1 + 1 pages either way."""
    proxy = static.StaticProxyProcess(None, {}, latency=0.0, listing=(3001, 3)).start()
    try:
        got = {}
        for client in CLIENTS:
            proxy.reset_counts()
            infos, stats = _tree("s3://bench/train", {"endpoint_url": proxy.url, "key": "k", "secret": "s"}, client,
                                 max_in_flight=in_flight)
            got[client] = (infos, dict(proxy.counts), stats["lists"])
    finally:
        proxy.stop()
    assert got["obstore"] == got["s3fs"]
    infos, counts, lists = got["s3fs"]
    assert counts == {"GET": 1 + 2 + 1 + 1} and lists == 1 + 3
    keys = [k.removeprefix("train/") for k in listing.synthetic_keys(3001, 3)]
    assert [(o.key, o.size, o.etag) for o in infos] == [
        (k, listing.SyntheticBucket.size(f"train/{k}"), listing.SyntheticBucket.etag(f"train/{k}").strip('"'))
        for k in sorted(keys, key=lambda k: k.split("/"))]


class _StallOnce(objstore_proxy.FaultProxy):
    """A FaultProxy whose `stall_at`-th GET (1-based) is held until the test ends (a page that went
    silent); the others are forwarded."""

    def __init__(self, upstream: str, stall_at: int) -> None:
        super().__init__(upstream, latency=0.0)
        self.stall_at, self.release, self.stalled = stall_at, threading.Event(), threading.Event()

    def _on_request(self, method: str) -> int:
        injected = super()._on_request(method)
        if method == "GET" and self.counts["GET"] == self.stall_at:
            self.stalled.set()
            self.release.wait(60)
        return injected

    def stop(self) -> None:
        self.release.set()
        super().stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stalled_page_is_retried_alone(static, listing, client):
    """Requests, one at a time: the root (1), prefix 0's pages 1 and 2 (2, 3: stalled past the 1 s
    timeout), then page 2 again (4, resumed after page 1's last key), prefixes 1 and 2 (5, 6).
    One retry, one extra LIST; the listing is complete and in order."""
    server = static.StaticProxyProcess(None, {}, latency=0.0, listing=(3001, 3)).start()
    proxy = _StallOnce(server.url, stall_at=3).start()
    try:
        infos, stats = _tree("s3://bench/train", {"endpoint_url": proxy.url, "key": "k", "secret": "s"}, client,
                             max_in_flight=1, timeout=1.0, retries=1)
        assert proxy.stalled.is_set() and dict(proxy.counts) == {"GET": 6}
    finally:
        proxy.stop()
        server.stop()
    assert (stats["lists"], stats["retries"]) == (1 + 3 + 1, 1)
    keys = [k.removeprefix("train/") for k in listing.synthetic_keys(3001, 3)]
    assert [o.key for o in infos] == sorted(keys, key=lambda k: k.split("/"))
