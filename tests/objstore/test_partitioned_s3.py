"""The partitioned cache over an s3:// ImageFolder (a real moto server and two real redis-servers):
two nodes whose memory holds the dataset together, one DataLoader per rank; from epoch 2 no object
is read from the store (GETs counted at the proxy: 0), every item is a local or a remote hit."""

from __future__ import annotations

from coordl_tests_loaderhelp import epoch_counts

import coordl


def test_partitioned_cache_over_s3_reads_nothing_from_the_store_after_epoch_one(s3, proxy, redis_nodes):
    urls = [redis_nodes().url, redis_nodes().url]
    opts = s3.options(endpoint_url=proxy.url)
    loaders = []
    for rank in range(2):
        ds = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=opts)
        loaders.append(coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, rank=rank, world_size=2,
                                         cache=coordl.PartitionedCache(urls, rank)))
    n = len(loaders[0].dataset)
    share = -(-n // 2)
    proxy.reset_counts()
    first = [epoch_counts(loader) for loader in loaders]
    assert [c["storage_reads"] for c in first] == [share, share]
    assert proxy.counts["GET"] == sum(c["storage_reads"] for c in first) and n <= 2 * share
    for _ in range(2):  # epochs 2 and 3: other shares (shuffled), all from the two nodes
        proxy.reset_counts()
        later = [epoch_counts(loader) for loader in loaders]
        assert proxy.counts["GET"] == 0
        assert [c["storage_reads"] for c in later] == [0, 0] and [c["samples"] for c in later] == [share, share]
        assert [c["local_hits"] + c["remote_hits"] for c in later] == [share, share]
        assert sum(c["remote_hits"] for c in later) > 0
