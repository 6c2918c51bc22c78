"""Which cache node owns an item: rendezvous (highest-random-weight) hashing. Pure, no I/O.

Every server computes the same owner for every item from nothing but the
dataset fingerprint, the item number and the node list, so placement needs no
metadata traffic and no coordination.

Why rendezvous hashing, and why of (fingerprint, item, node name):

- ``hash % N`` moves almost every item when a server is added or lost
  (``N-1`` of ``N`` items change owner), so one lost node would empty every
  node's useful cache. With rendezvous hashing each item goes to the node of
  highest weight ``w(item, node)``; removing a node moves only the items it
  owned (to their second choice), adding one moves only ``1/(N+1)`` of the
  items (to it). A consistent-hash ring has the same property but needs many
  virtual points per node to balance a few nodes; rendezvous balances exactly
  in expectation with no tables, and costs N hash evaluations per item, which
  for the handful of cache nodes of a training job is a few numpy passes.
- The node's *name* (its URL without the password: ``host:port/db`` or the
  unix socket path) is hashed, not its position in the list, so every server
  may list the nodes in any order and the owner is still the same.
- The seed and the epoch are *not* an input (unlike "the rank that reads the
  item first"): a later run with another seed, world size or batch size reuses
  everything already cached. The price is that the first epoch writes each
  item to its owner over the network, once.

The weight is splitmix64 (Steele et al.'s 64-bit finaliser) of the item mixed
with a per-node salt (xxh3 of fingerprint and node name): a few integer
operations, vectorised over numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = (x + _GOLDEN) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def node_salts(fingerprint: str, node_names: Sequence[str]) -> np.ndarray:
    """One uint64 per node, from the dataset fingerprint and the node's name."""
    if len(set(node_names)) != len(node_names):
        raise ValueError(f"node names must be distinct: {list(node_names)}")
    return np.array([xxhash.xxh3_64_intdigest(f"{fingerprint}\0{name}".encode()) for name in node_names],
                    dtype=np.uint64)


def owners(salts: np.ndarray, items: np.ndarray | Sequence[int]) -> np.ndarray:
    """The owning node (an index into the node list the salts were made from) of each item."""
    items = np.asarray(items, dtype=np.int64).astype(np.uint64)
    if len(salts) == 1:
        return np.zeros(len(items), dtype=np.int64)
    with np.errstate(over="ignore"):
        keyed = _mix(items)
        best = _mix(keyed ^ salts[0])
        owner = np.zeros(len(items), dtype=np.int64)
        for j in range(1, len(salts)):
            w = _mix(keyed ^ salts[j])
            better = w > best
            owner[better] = j
            best = np.where(better, w, best)
    return owner


def node_of_item(salts: np.ndarray, item: int) -> int:
    """The owner of one item (as `owners`)."""
    return int(owners(salts, [item])[0])


def items_per_node(salts: np.ndarray, n_items: int) -> np.ndarray:
    """How many of the items 0..n_items-1 each node owns."""
    return np.bincount(owners(salts, np.arange(n_items)), minlength=len(salts))
