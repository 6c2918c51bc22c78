"""`coordl.PartitionedCache`: the partitioned (Redis) cache with sizes as strings.

    cache = coordl.PartitionedCache(["redis://:pw@host1:6390/0", "redis://:pw@host2:6390/0"],
                                    node_rank=int(os.environ["GROUP_RANK"]), capacity_per_node="16GiB")
    loader = coordl.DataLoader(ds, batch_size=256, rank=rank, world_size=world, cache=cache)

See `coordl.cache.partitioned` for placement, reads, faults and the lifecycle,
and `coordl cache-node start` for the servers.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordl.cache import partitioned
from coordl.loader.caching import parse_size


class PartitionedCache(partitioned.PartitionedCache):
    """Items spread over one Redis cache node per server; a miss goes to its owner, then storage.

    Args:
        nodes: one Redis URL per server, the same list on every server
            (``redis://[:password@]host:port/db``, ``rediss://`` for TLS, ``unix://``).
        node_rank: the index in `nodes` of this server's own node.
        capacity_per_node: bytes or a size string ('16GiB') this dataset may hold on
            each node; None: up to each server's ``maxmemory``.
        timeout: seconds a node may take to answer before it is skipped (default 0.25).
        retry_after: seconds a node that failed is skipped before it is tried again.

    Construction connects to every node and raises `coordl.ConfigError` naming the
    URL and the fix for a wrong password, an unknown host, a closed port, a server
    that is not Redis, a replica, or a Redis whose eviction policy would thrash
    (LRU/LFU/random); and for one node listed twice under two spellings
    (``redis://localhost:6390`` and ``redis://127.0.0.1:6390/0``). Once running, any
    Redis error on a node makes it skipped for `retry_after` seconds (its items come
    from storage), counted in ``loader.stats()`` (``nodes_down``, ``node_faults``,
    worker processes included) and logged once with the fix; never an exception in
    the training loop.
    """

    def __init__(self, nodes: Sequence[str], node_rank: int, *, capacity_per_node: int | str | None = None,
                 timeout: float = 0.25, retry_after: float = 5.0) -> None:
        cap = None if capacity_per_node is None else parse_size(capacity_per_node, "capacity_per_node")
        super().__init__(nodes, node_rank, capacity_per_node=cap, timeout=timeout, retry_after=retry_after)
