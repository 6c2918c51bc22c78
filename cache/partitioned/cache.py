"""Partitioned caching: each server's Redis node holds the items it owns; misses go to the owner.

    cache = PartitionedCache(["redis://a:6390/0", "redis://b:6390/0", "redis://c:6390/0"], node_rank=1,
                             capacity_per_node=16 * 2**30)
    cache.open(fingerprint, n_items)      # done by coordl.DataLoader(cache=...)
    hits = cache.get_many(batch, counters)  # {item: bytes} from whichever node owns each item
    cache.put(i, raw)                       # admitted into i's owner, first touch until full

Placement is rendezvous hashing of (fingerprint, item, node name)
(cache/partitioned/placement.py): every server computes the same owner with no metadata
traffic, and a later run with another seed or world size reuses the cache. The
first epoch therefore writes each item once to its owner, from whichever rank
read it; from the second epoch on every item that fits the nodes' budgets
comes from memory, this server's own or a peer's.

Reads of this server's own node go through Redis as well (loopback TCP, or a
``unix://`` URL), not through a second copy in a local MinIO segment: each
item is held once, in one place, and the measured cost is small (docs/results.md,
"Partitioned caching": a 64-item batch of ~102 KiB JPEGs is one MGET of ~7 ms
over loopback TCP, a unix socket was no faster, MinIO views take ~1 ms; decoding
the batch takes ~110 ms of one core).

A batch's items are grouped by owner; each owner gets one MGET, all sent before
any reply is read (the remote owners' first, the local node's last), then read
on the calling thread, the local node's first: the transfers overlap and the
remote replies wait in their sockets' buffers. Each reply is read by
cache/partitioned/mgetread.py, every value received straight into its own buffer (redis-py's
parser copied it three times). No thread pool: a thread per
remote owner took 1.2-1.4x the CPU per item for no shorter wait (124-167 against
97-121 us of process CPU per ~117 KiB item, wall ~600 us both, between namespaces
on 1 Gbit veth links as bench/cluster.py builds them; 127 against 108 us through
its 0.2 ms delay relays). A node that hangs costs
its `timeout` once, as before; two hung nodes in one batch now cost two, before
both are skipped for `retry_after`. Values carry a header (magic, item, length, check) where the check
is the payload's xxh3 (`coordl.cache.checksum.digest`) xor a binding of the
whole dataset fingerprint and the item (`binding`): a value that fails it
(corrupt, under another item's key, or copied from another dataset's key of
the same item) is counted in ``remote_errors``, treated as a miss and never
served.

After a change of the node list (cache/partitioned/membership.py, ``membership='update'``), an
item whose owner changed is a miss on its new owner until it is written there. The
record the update replaced (``coordl:members:previous``) is read at connect; a batch's
misses whose owner under that previous list is another node still in this list
and usable are then read from it, one MGET per such node, after the first round's
replies (a second round, only for batches with such misses): counted as
``local_hits``/``remote_hits`` by where they came from and in ``moved_hits``, and
written to their new owner (`put`, counted in ``cache_inserts``), so the epoch after
adding a node reads nothing from storage. Items of a removed node still come from
storage. With no previous list, or for a miss whose previous owner is its owner, no
request is added.

Faults (cache/partitioned/nodehealth.py): every request has the client's `timeout`. Any
Redis error on a node (refused, reset, timed out, a read-only replica, an
error reply, a meta hash that is not coordl's) is a fault of that node: it is
skipped for `retry_after` seconds by every process of the loader, its items
come from storage (the caller's misses), the fault is counted (``nodes_down``,
``node_faults``) and logged once per kind with the fix, and the node is tried
again after that through a new connection, which checks the server again (a
primary, a policy that never evicts); nothing is raised to the training loop.
A node whose memory is full (noeviction refuses the write: OOM) or whose
`capacity_per_node` is reached admits nothing more; that is not a fault.

Admission is one Lua script per item on the owner (EVALSHA): write only if
the key is absent and the dataset's bytes on that node stay within
`capacity_per_node`, and count items and bytes in the dataset's meta hash
``coordl:<fingerprint>:meta``, atomically with respect to every other writer.

NOTE [lifecycle and processes]
- Constructed in the training process: it connects to every node once, checks
  each answers as a Redis primary with a non-evicting policy and belongs to
  this node list (cache/partitioned/membership.py; ConfigError if not), then drops nothing.
  Every later connection, in any process, checks the same
  (`nodehealth.checked_connect`; a node restarted empty gets its node list
  record back); failing it is a node fault.
- Forked workers: the first call in a new pid builds fresh clients (redis-py
  pools are not shared across processes). Spawned workers get the configuration by pickle
  (`__getstate__`) and connect lazily. Both share the node health table with
  the training process (cache/partitioned/nodehealth.py).
- coordl never flushes a node and touches only keys under
  ``coordl:<fingerprint>:``; `drop` deletes exactly those (SCAN + UNLINK).
"""

from __future__ import annotations

import functools
import inspect
import logging
import struct
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from coordl.errors import CacheError, ConfigError

from ..checksum import digest
from ..forkguard import ForkGuard
from ..redact import redact_url, scrub
from ..sizes import parse_size
from . import membership as membership_mod
from . import mgetread, nodehealth, nodetls, nodeurl, placement, redisnode

log = logging.getLogger("coordl.cache")

HEADER = struct.Struct("<4sQQQ")   # magic, item, payload length, xxh3-64 of the payload ^ binding
MAGIC = b"CDL2"
_SCHEMES = ("redis", "rediss", "unix")
_COUNTS = ("local_hits", "remote_hits", "remote_bytes", "remote_errors", "moved_hits", "cache_inserts",
           "ahead_hits")

# KEYS: item key, meta key. ARGV: value, capacity (0: the server's maxmemory only), n_items, label.
# Returns 1 written, 0 present, -1 over capacity, -2 the meta key is not coordl's (nothing written).
_ADMIT = """
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'hash' and t ~= 'none' then return -2 end
local used = redis.call('HGET', KEYS[2], 'bytes') or '0'
local count = redis.call('HGET', KEYS[2], 'items') or '0'
if not string.match(used, '^%d+$') or not string.match(count, '^%d+$') then return -2 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = string.len(ARGV[1])
local cap = tonumber(ARGV[2])
if cap > 0 and tonumber(used) + n > cap then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[2], 'bytes', n)
redis.call('HINCRBY', KEYS[2], 'items', 1)
redis.call('HSETNX', KEYS[2], 'n_items', ARGV[3])
redis.call('HSETNX', KEYS[2], 'label', ARGV[4])
redis.call('HSETNX', KEYS[2], 'capacity', ARGV[2])
return 1
"""


def binding(fingerprint: str, item: int) -> int:
    """64 bits of (the whole dataset fingerprint, the item): xored into a value's check, so a value
    verifies only under the dataset and item it was written for."""
    return xxhash.xxh3_64_intdigest(int(item).to_bytes(8, "little"), seed=_fingerprint_seed(fingerprint))


@functools.lru_cache(maxsize=64)
def _fingerprint_seed(fingerprint: str) -> int:
    return xxhash.xxh3_64_intdigest(fingerprint.encode())


def pack(bound: int, item: int, raw: bytes | memoryview) -> bytes:
    """A stored value: header + payload; `bound` is `binding(fingerprint, item)`."""
    return HEADER.pack(MAGIC, item, memoryview(raw).nbytes, digest(raw) ^ bound) + bytes(raw)


def unpack(bound: int, item: int, value: bytes) -> memoryview | None:
    """The payload of a stored value, or None when its header or check does not match `item` and
    `bound` (= `binding(fingerprint, item)`)."""
    if len(value) < HEADER.size:
        return None
    magic, it, n, check = HEADER.unpack_from(value)
    payload = memoryview(value)[HEADER.size:]
    if magic != MAGIC or it != item or n != payload.nbytes or digest(payload) ^ bound != check:
        return None
    return payload


class PartitionedCache:
    """A dataset's items spread over the cache nodes of several servers; see the module docstring.

    Args:
        nodes: one Redis URL per server (``redis://[:password@]host:port/db``,
            ``rediss://`` for TLS, ``unix:///path.sock``), the same list on every server.
        node_rank: which entry of `nodes` is this server's own node.
        capacity_per_node: bytes, or a size string ('16GiB'), of values this dataset may hold
            on each node (None: as much as the server's ``maxmemory`` allows).
        timeout: seconds a node may take to connect or answer before it is skipped.
        retry_after: seconds a node that failed is skipped before it is tried again.
        membership: 'check' (default): every node must belong to this node list (its
            ``coordl:members`` record, written by the first cache that connects; cache/partitioned/membership.py),
            else ConfigError naming the difference; 'update': rewrite that record to this list
            (after adding, removing or replacing a node, between epochs, on one rank).
        ssl_ca_certs, ssl_certfile, ssl_keyfile: for ``rediss://`` nodes: the CA that signed the
            nodes' certificates (default: the system's CAs), and the client certificate and key
            for nodes that require one (mutual TLS).
        read_ahead: True (default): a loader's worker sends the MGETs of the batch it gets next
            as soon as it has read this one's (`send_ahead`), so that the peers' answers come in
            while this batch is decoded; False: each batch's MGETs are sent when it is prepared.

    Construction connects to every node and raises `coordl.ConfigError` naming the
    URL and the fix for a wrong password, an unknown host, a closed port, a server
    that is not Redis, a replica, or a Redis whose eviction policy would thrash
    (LRU/LFU/random); and for one node listed twice under two spellings: names that
    `redisnode.node_name` makes one (``redis://localhost:6390``, ``redis://127.1:6390/0``,
    ``redis://[::ffff:127.0.0.1]:6390``), or any other (a host name and its address), caught by
    the servers' INFO ``run_id``. Once running, any
    Redis error on a node makes it skipped for `retry_after` seconds (its items come
    from storage), counted in ``loader.stats()`` (``nodes_down``, ``node_faults``,
    worker processes included) and logged once with the fix; never an exception in
    the training loop. ``coordl.PartitionedCache`` is this class.
    """

    def __init__(self, nodes: Sequence[str], node_rank: int, *, capacity_per_node: int | str | None = None,
                 timeout: float = 0.25, retry_after: float = 5.0, membership: str = "check",
                 ssl_ca_certs: str | None = None, ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 read_ahead: bool = True, _check: bool = True) -> None:
        self.nodes, self.node_rank = check_nodes(nodes), node_rank
        self._tls = nodetls.options(self.nodes, ssl_ca_certs, ssl_certfile, ssl_keyfile)
        if membership not in membership_mod.MODES:
            raise ConfigError(f"membership={membership!r} must be 'check' (refuse nodes that belong to another "
                              "node list) or 'update' (rewrite their list: after adding, removing or replacing "
                              "a node, between epochs)")
        self.membership = membership
        if not isinstance(read_ahead, bool):
            raise ConfigError(f"read_ahead={read_ahead!r} must be True (send the next batch's MGETs while this "
                              "one is prepared) or False")
        self.read_ahead = read_ahead
        self._members: str | None = None  # the node list checked at each new connection (after construction)
        if not (isinstance(node_rank, int) and 0 <= node_rank < len(self.nodes)):
            raise ConfigError(f"node_rank={node_rank!r} must be an int in [0, {len(self.nodes)}): the index "
                              "of this server's own node in nodes=")
        if capacity_per_node is not None:
            capacity_per_node = parse_size(capacity_per_node, "capacity_per_node")
        for name, v in (("timeout", timeout), ("retry_after", retry_after)):
            if not (isinstance(v, (int, float)) and v >= 0) or (name == "timeout" and v == 0):
                raise ConfigError(f"{name}={v!r} must be a positive number of seconds")
        self.capacity_per_node, self.timeout, self.retry_after = capacity_per_node, float(timeout), float(retry_after)
        self.fingerprint: str | None = None
        self._n, self._label, self._prefix = 0, "", ""
        self._salts: np.ndarray | None = None
        self._previous: list[str] | None = None  # the node list before the last update (membership.py)
        # (open) the previous list's placement salts, and per previous node its index in `nodes` (-1: gone)
        self._was: tuple[np.ndarray, np.ndarray] | None = None
        self._health = nodehealth.NodeHealth(len(self.nodes))
        self._full = [False] * len(self.nodes)
        self._maxmemory = [0] * len(self.nodes)
        self._fork = ForkGuard(owned=False)  # connections are rebuilt in each process
        self._ahead: _Ahead | None = None  # MGETs sent for the batch get_many is asked for next
        self._connect()
        if _check:
            run_ids = [self._check_node(j) for j in range(len(self.nodes))]
            membership_mod.one_server_each([redact_url(u) for u in self.nodes], run_ids)
            self._check_membership()
            self._previous = self._read_previous()
        self._members = membership_mod.record([redisnode.node_name(u) for u in self.nodes])

    # -- connections (rebuilt in each process) --
    def _connect(self) -> None:
        redis = redisnode.redis_module()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._clients = [redis.Redis.from_url(url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                                              retry=Retry(NoBackoff(), 0), health_check_interval=0,
                                              **_resp2(redis),
                                              **(self._tls if url.startswith("rediss:") else {}),
                                              redis_connect_func=functools.partial(
                                                  self._on_connect, url))
                         for url in self.nodes]
        self._scripts = [c.register_script(_ADMIT) for c in self._clients]
        self._fork.reset()

    def _on_connect(self, url: str, conn: Any) -> None:
        nodehealth.checked_connect(url, self.capacity_per_node, conn, members=self._members)

    def _client(self, j: int):
        if self._fork.forked():
            self._connect()
        return self._clients[j]

    def _check_node(self, j: int) -> str | None:
        """Refuse node j when it is unreachable or unfit (`redisnode.check_server`); its INFO run_id."""
        redis = redisnode.redis_module()
        url, shown = self.nodes[j], redact_url(self.nodes[j])
        try:
            info = redisnode.read_info(self._client(j))
        except nodehealth.unfit_error() as e:  # a replica, an evicting policy, no maxmemory
            raise ConfigError(str(e)) from None
        except redis.AuthenticationError as e:
            raise ConfigError(f"cache node {shown}: authentication failed ({e}): put the node's password in "
                              "the URL, redis://:PASSWORD@host:port/0 (see --password-file of "
                              "`coordl cache-node start`)") from None
        except redis.ResponseError as e:
            if "NOAUTH" in str(e) or "WRONGPASS" in str(e):
                raise ConfigError(f"cache node {shown}: {e}: put the node's password in the URL, "
                                  "redis://:PASSWORD@host:port/0") from None
            raise ConfigError(f"cache node {shown} refused INFO ({e}): coordl needs INFO to check the "
                              "server's eviction policy; allow it for this user") from None
        except (redis.TimeoutError, redis.ConnectionError) as e:
            tls = nodeurl.tls_problem(url, e)
            if tls:
                raise ConfigError(f"cache node {shown}: {tls}") from None
            if isinstance(e, redis.TimeoutError):
                raise ConfigError(f"cache node {shown} did not answer within timeout={self.timeout}s: check the "
                                  "host and port, that a firewall lets the port through, or raise timeout=") from None
            raise ConfigError(f"cache node {shown}: {scrub(_why(e), url)}") from None
        except redis.RedisError as e:  # a reply that is not RESP: not a Redis server
            raise ConfigError(f"cache node {shown} does not answer as a Redis server ({e}): check the URL's "
                              "host and port (a cache node is started with `coordl cache-node start`)") from None
        redisnode.check_server(url, info, self.capacity_per_node)
        self._maxmemory[j] = int(info.get("maxmemory", 0))
        return str(info["run_id"]) if info.get("run_id") else None

    def _check_membership(self) -> None:
        """Every node must belong to this node list (cache/partitioned/membership.py): written when it has no
        record yet, rewritten with membership='update', else ConfigError naming the difference."""
        redis = redisnode.redis_module()
        names = [redisnode.node_name(u) for u in self.nodes]
        for j, url in enumerate(self.nodes):
            shown = redact_url(url)
            try:
                done = membership_mod.agree(self._client(j), shown, names, self.membership == "update")
            except redis.ResponseError as e:
                raise ConfigError(f"cache node {shown}: {membership_mod.MEMBERS_KEY} cannot be read or written "
                                  f"({e}): if it is not coordl's (another type), delete it; if the user's ACL "
                                  "forbids it, allow GET and SET on coordl:* keys") from None
            if done.startswith("updated"):
                log.warning("cache node %s: node list %s", shown, done)

    def _read_previous(self) -> list[str] | None:
        """The node list before the last update, as most nodes hold it (membership.previous_of); a
        node whose previous record cannot be read (not coordl's) counts as holding none."""
        redis = redisnode.redis_module()
        held = []
        for j in range(len(self.nodes)):
            try:
                held.append(membership_mod.read_previous(self._client(j)))
            except redis.ResponseError as e:
                log.warning("cache node %s: %s cannot be read (%s): ignored; delete it if it is not coordl's",
                            redact_url(self.nodes[j]), membership_mod.PREVIOUS_KEY, e)
        return membership_mod.previous_of(held)

    # -- opening --
    @property
    def is_open(self) -> bool:
        """Whether `open` gave the cache its dataset."""
        return self.fingerprint is not None

    def open(self, fingerprint: str, n_items: int, label: str = "") -> PartitionedCache:
        """Serve dataset `fingerprint` (n_items items); nothing is written until the first put."""
        if self.fingerprint is not None and self.fingerprint != fingerprint:
            raise ConfigError(f"this PartitionedCache already serves dataset {self.fingerprint[:16]}; "
                              "make one PartitionedCache per dataset")
        names = [redisnode.node_name(u) for u in self.nodes]
        self.fingerprint, self._n, self._label = fingerprint, int(n_items), label
        self._prefix = f"{redisnode.KEY_PREFIX}{fingerprint[:32]}:"
        self._salts = placement.node_salts(fingerprint, names)
        if self._previous is not None and sorted(self._previous) != sorted(names):
            self._was = (placement.node_salts(fingerprint, self._previous),
                         np.array([names.index(n) if n in names else -1 for n in self._previous], dtype=np.int64))
        return self

    def key(self, i: int) -> str:
        """The Redis key of item i (under ``coordl:<fingerprint>:``)."""
        return f"{self._prefix}{i}"

    @property
    def meta_key(self) -> str:
        """The Redis key of the dataset's record on each node (beside its items' keys)."""
        return f"{self._prefix[:-1]}{redisnode.META_SUFFIX}"

    def owner(self, i: int) -> int:
        """The index in `nodes` of the node that owns item i."""
        return placement.node_of_item(self._require_open(), i)

    def _require_open(self) -> np.ndarray:
        if self._salts is None:
            raise CacheError("the PartitionedCache is not open: pass it to coordl.DataLoader(cache=...) "
                             "or call cache.open(fingerprint, n_items)")
        return self._salts

    def _check_item(self, i: int) -> None:
        if not 0 <= i < self._n:
            raise IndexError(f"item {i} is out of range for a cache of {self._n} items")

    # -- node health (cache/partitioned/nodehealth.py) --
    def _usable(self, j: int) -> bool:
        return self._health.usable(j)

    def _failed(self, j: int, e: Exception | str, kind: str | None = None) -> None:
        """Node j faulted: skip it for retry_after (every process), count and log it, and drop its
        connections, so that the next use reconnects and checks the server again."""
        kind = kind or nodehealth.classify(e)
        shown = redact_url(self.nodes[j])
        self._health.fault(j, self.retry_after, kind, nodehealth.describe(shown, kind, e, self.retry_after))
        self._full[j] = False  # when it answers again it may be a fresh, empty server
        if self._fork.owner():
            self._clients[j].connection_pool.disconnect()

    # -- reads --
    def get_many(self, indices: Iterable[int], counters: Any = None) -> dict[int, memoryview]:
        """{item: bytes} for the items of `indices` that some node serves; the rest are misses."""
        items = np.fromiter((int(i) for i in indices), dtype=np.int64)
        if not len(items):
            return {}
        for i in (items.min(), items.max()):
            self._check_item(int(i))
        tally = dict.fromkeys(_COUNTS, 0)
        hits: dict[int, memoryview] = {}
        ahead = self._take_ahead(items)
        if ahead is not None:  # sent by send_ahead while the last batch was prepared
            owner = ahead.owner
            self._read_sent(ahead.groups, ahead.sent, hits, tally)
            tally["ahead_hits"] = len(hits)
        else:
            owner = placement.owners(self._require_open(), items)
            self._read_groups(self._groups(items, owner), hits, tally)
        if self._was is not None and len(hits) < len(items):
            self._moved(items, owner, *self._was, hits, tally)
        if counters is not None:
            counters.add(**tally)
        return hits

    def _groups(self, items: np.ndarray, owner: np.ndarray) -> dict[int, list[int]]:
        """{node: its items} for the usable nodes among `owner` (one per item)."""
        return {int(j): items[owner == j].tolist() for j in np.unique(owner) if self._usable(int(j))}

    def _moved(self, items: np.ndarray, owner: np.ndarray, was_salts: np.ndarray, was_node: np.ndarray,
               hits: dict, tally: dict) -> None:
        """The misses that changed owner at the last node list update, read from their previous owner
        where it is still a node of this list (one MGET each), and written to their owner now."""
        missed = np.fromiter((int(i) not in hits for i in items), dtype=bool, count=len(items))
        was = was_node[placement.owners(was_salts, items[missed])]
        keep = (was >= 0) & (was != owner[missed])
        if not keep.any():
            return
        found: dict[int, memoryview] = {}
        self._read_groups(self._groups(items[missed][keep], was[keep]), found, tally)
        tally["moved_hits"] += len(found)
        for i, raw in found.items():
            hits[i] = raw
            tally["cache_inserts"] += self.put(i, raw)

    def send_ahead(self, indices: Iterable[int]) -> None:
        """Send now the MGETs of the batch this process will ask `get_many` for next: their replies
        come in while the current batch is prepared, and that `get_many` reads them from the
        sockets instead of sending and waiting. A `get_many` of other items reads and drops them
        first (so does the next `send_ahead`). One batch ahead per process; a forked child never
        reads its parent's. Nothing is sent with ``read_ahead=False``."""
        self._drop_ahead()
        items = np.fromiter((int(i) for i in indices), dtype=np.int64)
        if not self.read_ahead or not len(items) or self.fingerprint is None:
            return
        for i in (items.min(), items.max()):
            self._check_item(int(i))
        owner = placement.owners(self._require_open(), items)
        groups = self._groups(items, owner)
        self._ahead = _Ahead(ForkGuard(), items.tobytes(), owner, groups, self._send_groups(groups))

    def _take_ahead(self, items: np.ndarray) -> _Ahead | None:
        """The MGETs send_ahead sent in this process for exactly `items`, or None (any others are
        read and dropped)."""
        ahead = self._ahead
        if ahead is None or not ahead.fork.owner():
            self._ahead = None
            return None
        if ahead.items == items.tobytes():
            self._ahead = None
            return ahead
        self._drop_ahead()
        return None

    def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.fork.owner():
            self._read_sent(ahead.groups, ahead.sent, {}, dict.fromkeys(_COUNTS, 0))

    def _send_groups(self, groups: dict[int, list[int]]) -> list[tuple[int, Any]]:
        """Send one MGET per node of `groups`, the remote owners first, the local node last; the
        (node, connection) pairs in reading order: the local node first."""
        order = sorted(groups, key=lambda j: j != self.node_rank)
        sent: list[tuple[int, Any]] = []
        try:
            for j in reversed(order):
                sent.append((j, self._send(j, groups[j])))
        except BaseException:
            self._release_unread(sent)
            raise
        sent.reverse()
        return sent

    def _release_unread(self, sent: list[tuple[int, Any]]) -> None:
        for j, conn in sent:  # replies left unread: their connections cannot be reused
            if conn is not None:
                conn.disconnect()
                self._clients[j].connection_pool.release(conn)

    def _read_groups(self, groups: dict[int, list[int]], hits: dict, tally: dict) -> None:
        """One MGET per node of `groups` ({node: items}), all sent before any reply is read; the
        values that verify go into `hits`, counted into `tally`."""
        self._read_sent(groups, self._send_groups(groups), hits, tally)

    def _read_sent(self, groups: dict[int, list[int]], sent: list[tuple[int, Any]], hits: dict,
                   tally: dict) -> None:
        """Read the replies of the MGETs `sent` for `groups`, in order."""
        sent = list(sent)
        try:
            while sent:
                j, conn = sent.pop(0)
                if conn is not None and not self._usable(j):  # failed since its MGET went out (a batch
                    self._release_unread([(j, conn)])          # ahead): its items are misses, as when down
                    continue
                values = None if conn is None else self._reply(j, conn)
                local = j == self.node_rank
                self._collect(groups[j], values, hits, tally, "local_hits" if local else "remote_hits", not local)
        finally:
            self._release_unread(sent)  # (an exception)

    def get(self, i: int, counters: Any = None) -> memoryview | None:
        """Item i's bytes from its owner, or None (a miss, an unusable node or a bad value)."""
        return self.get_many([i], counters).get(int(i))

    def _send(self, j: int, items: list[int]) -> Any:
        """Send node j the MGET of `items` on a connection of its pool; the connection (its reply
        unread, `_reply` reads it), or None when the node failed."""
        redis = redisnode.redis_module()
        pool = self._client(j).connection_pool
        try:
            conn = _connection(pool)
        except redis.RedisError as e:
            self._failed(j, e)
            return None
        try:
            conn.send_command("MGET", *[self.key(i) for i in items])
        except redis.RedisError as e:
            conn.disconnect()
            pool.release(conn)
            self._failed(j, e)
            return None
        return conn

    def _reply(self, j: int, conn: Any) -> list | None:
        """The raw values of node j's MGET sent on `conn`, which goes back to the pool; None when
        the node failed."""
        redis = redisnode.redis_module()
        try:
            return mgetread.read_mget(conn)  # each value copied once, socket -> its buffer
        except redis.RedisError as e:
            conn.disconnect()  # (an error reply leaves it usable; a new connection checks the node again)
            self._failed(j, e)
            return None
        finally:
            self._clients[j].connection_pool.release(conn)

    def _collect(self, items: list[int], values: list | None, hits: dict, tally: dict,
                 kind: str, remote: bool) -> None:
        if values is None:
            tally["remote_errors"] += 1
            return
        for i, value in zip(items, values):
            if value is None:
                continue
            payload = unpack(binding(self.fingerprint or "", i), i, value)
            if payload is None:
                tally["remote_errors"] += 1
                continue
            hits[i] = payload
            tally[kind] += 1
            if remote:
                tally["remote_bytes"] += payload.nbytes

    # -- writes --
    def put(self, i: int, raw: bytes | memoryview) -> bool:
        """Offer item i's bytes to its owner; True when admitted (first touch, while it has room)."""
        self._check_item(i)
        j = self.owner(i)
        if self._full[j] or not self._usable(j) or memoryview(raw).nbytes == 0:
            return False
        redis = redisnode.redis_module()
        if self._fork.forked():
            self._connect()
        try:
            done = int(self._scripts[j](keys=[self.key(i), self.meta_key],
                                        args=[pack(binding(self.fingerprint or "", i), i, raw),
                                              self.capacity_per_node or 0, self._n, self._label],
                                        client=self._clients[j]))
        except redis.ResponseError as e:
            if "OOM" not in str(e) and "maxmemory" not in str(e):  # (redis-py's OutOfMemoryError drops "OOM")
                self._failed(j, e)
                return False
            self._full[j] = True  # noeviction at maxmemory: admission stops there, not a fault
            return False
        except redis.RedisError as e:
            self._failed(j, e)
            return False
        if done == -2:
            self._failed(j, self._meta_problem(), "meta")
        return done == 1

    def _meta_problem(self) -> str:
        return (f"the meta hash {self.meta_key} is not coordl's (another type, or bytes/items that are not "
                "integers: another program wrote it); nothing is written to this node until it is deleted")

    # -- state --
    def stats(self) -> dict[str, int]:
        """This server's node: cache_bytes and cache_items of this dataset, cache_capacity, the node's
        used memory and maxmemory, and how many nodes this process is skipping now."""
        j = self.node_rank
        cap = self.capacity_per_node or self._maxmemory[j]
        out = {"cache_bytes": 0, "cache_items": 0, "cache_capacity": cap, "node_used_memory": 0,
               "node_maxmemory": self._maxmemory[j]}
        if self._salts is not None and self._usable(j):
            out.update(self._node_stats(j))
        return {**out, "nodes_down": self._health.nodes_down(), "node_faults": self._health.faults()}

    def _node_stats(self, j: int) -> dict[str, int]:
        redis = redisnode.redis_module()
        try:
            client = self._client(j)
            nbytes, nitems = client.hmget(self.meta_key, "bytes", "items")
            mem = client.info("memory")
        except redis.RedisError as e:
            self._failed(j, e)
            return {}
        try:
            return {"cache_bytes": int(nbytes or 0), "cache_items": int(nitems or 0),
                    "node_used_memory": int(mem.get("used_memory", 0)),
                    "node_maxmemory": int(mem.get("maxmemory", 0))}
        except ValueError:
            self._failed(j, self._meta_problem(), "meta")
            return {}

    def drop(self) -> int:
        """Delete this dataset's keys (and only those) from every node that answers; keys deleted."""
        self._require_open()
        redis = redisnode.redis_module()
        deleted = 0
        for j in range(len(self.nodes)):
            try:
                client = self._client(j)
                batch = []
                for key in client.scan_iter(match=f"{_glob_escape(self._prefix)}*", count=1000):
                    batch.append(key)
                    if len(batch) >= 1000:
                        deleted += client.unlink(*batch)
                        batch = []
                if batch:
                    deleted += client.unlink(*batch)
            except redis.RedisError as e:
                self._failed(j, e)
        return deleted

    def close(self) -> None:
        """Close the connections of this process."""
        self._ahead = None  # its connections are closed with the rest
        if self._fork.owner():
            for c in self._clients:
                c.close()

    def __getstate__(self) -> dict:
        """Spawned workers get the configuration (URLs, which may carry the password) by pickle, and
        the node health table's fd while multiprocessing starts them (cache/partitioned/nodehealth.py)."""
        return {"nodes": self.nodes, "node_rank": self.node_rank, "capacity_per_node": self.capacity_per_node,
                "timeout": self.timeout, "retry_after": self.retry_after, "fingerprint": self.fingerprint,
                "tls": self._tls, "membership": self.membership, "previous": self._previous,
                "read_ahead": self.read_ahead,
                "n": self._n, "label": self._label, "maxmemory": self._maxmemory,
                "health": self._health.state()}

    def __setstate__(self, state: dict) -> None:
        PartitionedCache.__init__(self, state["nodes"], state["node_rank"],
                                  capacity_per_node=state["capacity_per_node"], timeout=state["timeout"],
                                  retry_after=state["retry_after"], membership=state["membership"],
                                  read_ahead=state.get("read_ahead", True), **state["tls"], _check=False)
        self._maxmemory = list(state["maxmemory"])
        self._health = nodehealth.NodeHealth.from_state(len(self.nodes), state.get("health"))
        self._previous = state.get("previous")
        if state["fingerprint"] is not None:
            self.open(state["fingerprint"], state["n"], state["label"])

    def __repr__(self) -> str:
        nodes = ", ".join(redact_url(u) for u in self.nodes)
        return f"PartitionedCache(nodes=[{nodes}], node_rank={self.node_rank})"


class _Ahead(NamedTuple):
    """MGETs sent by `PartitionedCache.send_ahead`, their replies unread."""
    fork: ForkGuard                   # the process that sent them (a forked child never reads them)
    items: bytes                      # the items, as int64 bytes (compared with get_many's)
    owner: np.ndarray                 # each item's owner (placement.owners)
    groups: dict[int, list[int]]      # {node: its items}
    sent: list[tuple[int, Any]]       # (node, connection or None), local node first


def check_nodes(nodes: Sequence[str]) -> list[str]:
    """`nodes` as PartitionedCache and `coordl cache-node status` take it: a list of Redis URLs, each node
    once (by `redisnode.node_name`); else a ConfigError naming the entry and the fix."""
    if isinstance(nodes, str) or not isinstance(nodes, Sequence) or not nodes:
        raise ConfigError(f"nodes={nodes!r} must be a non-empty list of Redis URLs, one per server, "
                          "e.g. ['redis://host1:6390/0', 'redis://host2:6390/0']")
    out = []
    for url in nodes:
        scheme = url.partition("://")[0] if isinstance(url, str) and "://" in url else None
        if scheme not in _SCHEMES:
            raise ConfigError(f"nodes entry {url!r} is not a Redis URL: use redis://[:password@]host:port/db, "
                              "rediss://... (TLS) or unix:///path/to/redis.sock")
        out.append(url)
    seen: dict[str, str] = {}
    for url in out:
        try:
            name = redisnode.node_name(url)
        except ValueError as e:
            raise ConfigError(f"nodes entry {redact_url(url)!r} is not a valid Redis URL ({e}): use "
                              "redis://[:password@]host:port/db") from None
        if name in seen:
            raise ConfigError(f"nodes= lists the same node twice: {redact_url(seen[name])!r} and "
                              f"{redact_url(url)!r} are both {name} (host, port and db): list each "
                              "server's node once")
        seen[name] = url
    return out


def _connection(pool: Any) -> Any:
    """A connected connection of redis-py `pool` (redis-py >= 5.3 takes no argument; 4.5-5.2 need
    the command's name)."""
    return pool.get_connection() if _takes_no_command(type(pool)) else pool.get_connection("MGET")


def _resp2(redis: Any) -> dict[str, int]:
    """protocol=2 where redis-py speaks RESP3 (5.0 on; its default from 8.0): the MGET replies are then
    read by cache/partitioned/mgetread.py (RESP2 framing, no push messages), as every redis-py before 8.0 did."""
    return {"protocol": 2} if "protocol" in inspect.signature(redis.Redis.__init__).parameters else {}


@functools.lru_cache(maxsize=8)
def _takes_no_command(pool_type: type) -> bool:
    param = inspect.signature(pool_type.get_connection).parameters.get("command_name")
    return param is None or param.default is not inspect.Parameter.empty


def _why(e: Exception) -> str:
    text = str(e)
    low = text.lower()
    if "name or service not known" in low or "name resolution" in low or "nodename nor servname" in low:
        return f"unknown host ({text}): check the host name in the URL"
    if "refused" in low:
        return (f"connection refused ({text}): nothing listens there; start a node with "
                "`coordl cache-node start --port PORT` on that server, or fix the URL's port")
    return f"cannot connect ({text}): check the URL, or start the node with `coordl cache-node start`"


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)
