"""`coordl.PartitionedCache`: the partitioned (Redis) cache, `coordl.cache.partitioned.cache.PartitionedCache`.

    cache = coordl.PartitionedCache(["redis://:pw@host1:6390/0", "redis://:pw@host2:6390/0"],
                                    node_rank=int(os.environ["GROUP_RANK"]), capacity_per_node="16GiB")
    loader = coordl.DataLoader(ds, batch_size=256, rank=rank, world_size=world, cache=cache)

The class is defined once, in cache/partitioned/cache.py (placement, reads, faults, the
lifecycle, sizes as strings); `coordl cache-node start` starts the servers.
"""

from __future__ import annotations

from coordl.cache.partitioned.cache import PartitionedCache

__all__ = ["PartitionedCache"]
