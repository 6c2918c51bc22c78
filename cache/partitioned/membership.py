"""Which node list a cache node belongs to: one record per node, checked when a PartitionedCache connects.

    names = [redisnode.node_name(u) for u in nodes]
    agree(client, shown, names, update=False)   # None, or ConfigError naming the difference
    agree(client, shown, names, update=True)    # rewrite the record (between epochs, after a change)

Placement (cache/partitioned/placement.py) is a function of the node list, so two ranks
given different lists disagree on owners: each would write and look for items
on different nodes, with no error. The list is therefore part of the cache's
identity, but *not* in the key space: a digest of the list in every key would
orphan every cached item whenever a node is added or replaced, where
rendezvous hashing moves only that node's share.

Instead each node holds ``coordl:members``: the normalised names
(`redisnode.node_name`, no scheme, user or password) of the list it belongs to,
sorted, one per line. The first PartitionedCache to connect writes it (SET NX,
so of two ranks racing with different lists one wins and the other is
refused); every later one must list exactly the same nodes, else ConfigError
naming the nodes one list has and the other lacks. A deliberate change
(a node added, removed or replaced) is made between epochs with
``membership="update"`` on one rank, or `coordl cache-node members --update
URL...`: the new list is written to every node of it, the items of the nodes
that stay are kept, and ranks still holding the old list are refused.

The list a node's record replaced is kept beside it, in ``coordl:members:previous``
(written by that update, on each node that had a record of another list; a node
that had none, the one just added, gets none). A PartitionedCache reads it from
every node at connect and takes the list most nodes hold (`previous_of`), so that
an item that changed owner is read from its previous owner, if that node is still
in the list, instead of from storage, and then written to its new one
(cache/partitioned/cache.py). It stays until the next update replaces it; an update to
the same list changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordl.errors import ConfigError

MEMBERS_KEY = "coordl:members"
PREVIOUS_KEY = "coordl:members:previous"  # the record MEMBERS_KEY held before the last update
MODES = ("check", "update")


def record(names: Sequence[str]) -> str:
    """The record of a node list: its normalised names, sorted, one per line (order does not matter)."""
    return "\n".join(sorted(names))


def parse(value: Any) -> list[str]:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return [line for line in text.split("\n") if line]


def difference(mine: Sequence[str], theirs: Sequence[str]) -> str:
    """'this list has X that the node's lacks; the node's has Y that this list lacks' (the non-empty parts)."""
    extra, missing = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    parts = []
    if extra:
        parts.append(f"this rank's nodes= has {', '.join(extra)}, which the node's list lacks")
    if missing:
        parts.append(f"the node's list has {', '.join(missing)}, which this rank's nodes= lacks")
    return "; ".join(parts)


def read(client: Any) -> list[str] | None:
    """The node list `client`'s node belongs to (None: no record yet)."""
    value = client.get(MEMBERS_KEY)
    return None if value is None else parse(value)


def read_previous(client: Any) -> list[str] | None:
    """The node list `client`'s node belonged to before the last update (None: never updated)."""
    value = client.get(PREVIOUS_KEY)
    return None if value is None else parse(value)


def previous_of(lists: Sequence[list[str] | None]) -> list[str] | None:
    """The previous node list most of the nodes hold (`read_previous` of each; ties: the smallest
    record, so every rank picks the same); None when none holds one. Nodes may differ: one added
    has none, one re-added after a removal may hold an older list."""
    counts: dict[str, int] = {}
    for names in lists:
        if names:
            counts[record(names)] = counts.get(record(names), 0) + 1
    if not counts:
        return None
    best = min(counts, key=lambda r: (-counts[r], r))
    return parse(best)


def agree(client: Any, shown: str, names: Sequence[str], update: bool = False) -> str:
    """Make sure the node behind `client` (shown as `shown`) belongs to the list `names`.

    Returns what was done: 'same', 'written' (no record before) or 'updated' (from what; the
    record replaced is kept under PREVIOUS_KEY).
    Raises ConfigError naming the difference when the node belongs to another list and not `update`.
    Redis errors (WRONGTYPE: the key is not coordl's) propagate to the caller."""
    mine = record(names)
    if client.set(MEMBERS_KEY, mine, nx=True):
        return "written"
    theirs = read(client) or []
    if record(theirs) == mine:
        return "same"
    if update:
        client.set(PREVIOUS_KEY, record(theirs))  # first: a record rewritten always has its previous
        client.set(MEMBERS_KEY, mine)
        return f"updated ({difference(names, theirs)})"
    raise ConfigError(
        f"cache node {shown} belongs to another node list ({len(theirs)} nodes, this rank gives "
        f"{len(names)}): {difference(names, theirs)}. Every rank must pass the same nodes= (placement "
        "depends on it; ranks with different lists would look for items on different nodes). If the "
        "cluster changed on purpose (a node added, removed or replaced), pass membership='update' on one "
        "rank between epochs, or run `coordl cache-node members --update URL...` with the new list "
        "(docs/partitioned-cache.md, 'Adding, removing or replacing a cache node')")


def one_server_each(shown: Sequence[str], run_ids: Sequence[str | None]) -> None:
    """Refuse one redis-server listed twice under names `redisnode.node_name` cannot tell apart (a host
    name and its address, two addresses of one machine, two dbs of one server): `run_ids` are the
    servers' INFO ``run_id``s (random at each server start), in the order of `shown` (the redacted
    URLs); None for a node whose INFO was not read. ConfigError naming both entries."""
    seen: dict[str, str] = {}
    for url, run_id in zip(shown, run_ids):
        if not run_id:
            continue
        if run_id in seen:
            raise ConfigError(
                f"nodes= lists one server twice: {seen[run_id]!r} and {url!r} are the same redis-server "
                f"(INFO run_id {run_id[:12]}...), under two spellings (a host name and its address, two "
                "addresses of one machine, or two dbs of it, which share its memory): list each server's "
                "node once, under one name, the same on every rank")
        seen[run_id] = url
