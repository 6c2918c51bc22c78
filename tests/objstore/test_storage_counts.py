"""stats() of a loader over s3:// counts the object store's GET requests and retries
(`storage_requests`, `storage_retries`), equal to what the proxy saw (a real moto server)."""

from __future__ import annotations

import pytest

import coordl


@pytest.mark.parametrize("workers", [0, 2])
def test_injected_503s_are_counted_as_requests_and_retries(s3, proxy, workers):
    ds = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=s3.options(endpoint_url=proxy.url))
    n = len(ds)
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=workers)
    proxy.reset_counts()
    proxy.inject(503, 5)
    for _ in loader:
        pass
    stats = loader.stats()
    assert proxy.counts["GET"] == n + 5
    assert (stats["storage_reads"], stats["storage_requests"], stats["storage_retries"]) == (n, n + 5, 5)
    proxy.reset_counts()
    for _ in loader:  # a clean epoch: one request per object, no retry
        pass
    after = loader.stats()
    assert proxy.counts["GET"] == n
    assert (after["storage_requests"] - stats["storage_requests"], after["storage_retries"]) == (n, 5)


def test_a_local_folder_counts_no_requests(s3):
    loader = coordl.DataLoader(coordl.ImageFolder(s3.root, transform="val", size=32), batch_size=8)
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats["storage_reads"] == len(loader.dataset)
    assert (stats["storage_requests"], stats["storage_retries"]) == (0, 0)
