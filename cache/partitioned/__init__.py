"""The partitioned room: each server's Redis cache node holds the items it owns; misses go to the owner.

- `cache`: `PartitionedCache`, the client side (open, get_many, put; the value format).
- `placement`: which node owns an item (rendezvous hashing, pure).
- `membership`: the node list and its changes, agreed across ranks.
- `mgetread`, `recycle`: one pipelined MGET per owner, received into reused buffers.
- `nodehealth`: which nodes are down, shared by the processes of a server; retried later.
- `redisnode`: start, check and describe a Redis cache node (`coordl cache-node`); `nodeproc`
  (which process is a node, who holds a port), `nodeurl` (node URLs, `check_nodes`), `nodetls`
  and `certdates` (TLS options and certificate dates).
"""

from .cache import PartitionedCache

__all__ = ["PartitionedCache"]
