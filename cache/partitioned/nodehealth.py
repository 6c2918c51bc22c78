"""Cache node faults: which nodes a PartitionedCache skips, shared by a loader's processes, and why.

    health = NodeHealth(len(nodes))
    if health.usable(j): ...                       # not inside a back-off
    health.fault(j, retry_after, kind, message)    # skip node j, count it, log `message` once per kind
    health.nodes_down(), health.faults()           # what loader.stats() reports

Any Redis error on a node is a fault of that node, never an error of the training loop: the node
is skipped for ``retry_after`` seconds, its items come from storage, and it is tried again after
that through a new connection, which checks the server again (`checked_connect`: a primary, a
policy that never evicts, a memory limit). The kinds, each logged once per node with its fix:

- ``unreachable``: refused, reset, timed out;
- ``readonly``: a replica ("You can't write against a read only replica");
- ``unfit``: the check at connection failed (an evicting policy, no maxmemory);
- ``meta``: the dataset's meta hash is not coordl's (another type, fields that are not integers);
- ``members``: the node now belongs to another node list (cache/partitioned/membership.py: its record was
  rewritten by ``membership='update'`` or `coordl cache-node members --update`);
- ``refused``: any other error reply (ACL, a busy script, ...).

A node whose memory is full (noeviction: OOM) is not a fault: it admits nothing more.

NOTE [lifecycle of the health table]
- Who creates: `NodeHealth()`, in the process that builds the PartitionedCache: an anonymous
  memfd (nothing named in /dev/shm) of one row per node: skipped until (CLOCK_MONOTONIC ns,
  the same clock in every process of the machine), faults, kinds already logged.
- Who attaches: forked workers inherit the shared mapping; spawned and forkserver workers get
  the fd while multiprocessing starts them (`state()`, fd passing); a copy pickled anywhere else
  gets a table of its own. So a node one worker finds down is skipped by every worker, and the
  training process's ``loader.stats()["nodes_down"]`` sees it.
- Who frees: nobody by name; the kernel frees the memory when the last process that maps it
  exits (SIGKILL included).
- Writes are plain int64 stores without a lock: two processes that fail at once may both log
  (then a kind is logged twice) or lose one increment of the fault count.
"""

from __future__ import annotations

import functools
import logging
import mmap
import multiprocessing.context as mp_context
import os
import time
import weakref
from multiprocessing import reduction
from typing import Any

import numpy as np

from coordl.errors import ConfigError

from . import redisnode

log = logging.getLogger("coordl.cache")

KINDS = ("unreachable", "readonly", "unfit", "meta", "refused", "members")
_UNTIL, _FAULTS, _LOGGED = range(3)


class NodeHealth:
    """One row per node in memory shared with the worker processes; see the module docstring."""

    def __init__(self, n_nodes: int, fd: int | None = None) -> None:
        size = max(mmap.PAGESIZE, n_nodes * 3 * 8)
        if fd is None:
            fd = os.memfd_create("coordl-node-health", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        self._fd = fd
        weakref.finalize(self, os.close, fd)
        self._map = mmap.mmap(fd, size)
        self.table = np.frombuffer(self._map, dtype=np.int64, count=n_nodes * 3).reshape(n_nodes, 3)

    def state(self) -> Any:
        """What pickling carries: the fd while multiprocessing starts a process (it passes the fd),
        else nothing (the copy makes a table of its own)."""
        return reduction.DupFd(self._fd) if mp_context.get_spawning_popen() is not None else None

    @classmethod
    def from_state(cls, n_nodes: int, state: Any) -> NodeHealth:
        return cls(n_nodes, None if state is None else state.detach())

    def usable(self, j: int) -> bool:
        return time.monotonic_ns() >= self.table[j, _UNTIL]

    def fault(self, j: int, retry_after: float, kind: str, message: str) -> None:
        """Skip node j for `retry_after` seconds, count the fault, log `message` if this kind was not yet."""
        row = self.table[j]
        row[_UNTIL] = time.monotonic_ns() + int(retry_after * 1e9)
        row[_FAULTS] += 1
        bit = 1 << KINDS.index(kind)
        if not row[_LOGGED] & bit:
            row[_LOGGED] |= bit
            log.warning("%s", message)

    def nodes_down(self) -> int:
        return int(np.sum(self.table[:, _UNTIL] > time.monotonic_ns()))

    def faults(self) -> int:
        return int(self.table[:, _FAULTS].sum())


@functools.cache
def unfit_error() -> type[Exception]:
    """The error a connection raises when the server fails `redisnode.check_server` (a redis-py
    ConnectionError, so that the pool drops the connection and the request fails)."""
    redis = redisnode.redis_module()

    class NodeUnfit(redis.ConnectionError):
        def __init__(self, message: str, kind: str) -> None:
            super().__init__(message)
            self.kind = kind

    return NodeUnfit


def checked_connect(url: str, capacity: int | None, conn: Any, members: str | None = None) -> None:
    """redis-py's ``redis_connect_func``: the usual handshake (AUTH, SELECT), then INFO, then
    `redisnode.check_server`: every new connection (the first, and each after a restart or a
    fault) proves the node is a primary that never evicts coordl's items. With `members` (the
    node list's record, cache/partitioned/membership.py): the node must still belong to that list; a node
    restarted empty gets the record back (SET NX)."""
    conn.on_connect()
    info: dict[str, str] = {}
    for section in ("replication", "memory"):
        conn.send_command("INFO", section)
        reply = conn.read_response()
        for line in (reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)).splitlines():
            key, sep, value = line.partition(":")
            if sep and not key.startswith("#"):
                info[key.strip()] = value.strip()
    try:
        redisnode.check_server(url, info, capacity)
    except ConfigError as e:
        raise unfit_error()(str(e), "readonly" if info.get("role", "master") != "master" else "unfit") from None
    if members is not None:
        _check_members(url, conn, members)


def _check_members(url: str, conn: Any, members: str) -> None:
    from . import membership

    conn.send_command("SET", membership.MEMBERS_KEY, members, "NX")
    if conn.read_response() is not None:
        return
    conn.send_command("GET", membership.MEMBERS_KEY)
    theirs = membership.parse(conn.read_response() or b"")
    if membership.record(theirs) != members:
        raise unfit_error()(f"the node now belongs to another node list: "
                            f"{membership.difference(members.split(chr(10)), theirs)}", "members")


def classify(e: Exception | str) -> str:
    """The fault kind of a redis-py error."""
    if isinstance(e, unfit_error()):
        return str(getattr(e, "kind", "unfit"))
    if str(e).startswith("READONLY") or "read only replica" in str(e):
        return "readonly"
    redis = redisnode.redis_module()
    if isinstance(e, (redis.ConnectionError, redis.TimeoutError)):
        return "unreachable"
    return "refused"


def describe(shown: str, kind: str, e: Exception | str, retry_after: float) -> str:
    """The log line of a fault: the node, what happened, what coordl does, the fix."""
    skip = (f"skipped for retry_after={retry_after:g}s (its items are read from storage), then tried "
            "through a new connection that checks the server again")
    fixes = {
        "unreachable": "check that it runs (`coordl cache-node status URL`) and that the port is reachable",
        "readonly": "it is a replica: make it a primary again with REPLICAOF NO ONE, or list a primary",
        "unfit": "as the message says",
        "meta": "delete that key (DEL it, or cache.drop() for the whole dataset); coordl rebuilds it",
        "refused": "check the server's log and the user's ACL permissions (GET, MGET, EVALSHA, INFO)",
        "members": ("the cluster changed under this job: restart every rank with the new node list "
                    "(`coordl cache-node members URL...` shows each node's)"),
    }
    return f"cache node {shown}: {e}; {skip}; fix: {fixes[kind]}"
