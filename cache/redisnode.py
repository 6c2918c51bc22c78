"""A cache node: a `redis-server` configured as a static store, and what is checked on one.

    cfg = NodeConfig(port=6390, memory=16 * 2**30)
    proc = launch(cfg, directory)            # redis-server, config on stdin (no password in argv)
    wait_ready(cfg.url, proc)                # PING answers
    inspect(client)                          # memory, policy, coordl datasets on the node

The configuration is the MinIO policy on Redis: ``maxmemory`` = the budget,
``maxmemory-policy noeviction`` (once full, writes are refused and nothing is
ever replaced: an LRU would thrash exactly as the page cache does under random
order), no RDB snapshots and no AOF (a cache node holds nothing that storage
does not), ``protected-mode yes`` and, when it binds beyond loopback, a
required password.

NOTE [lifecycle of a cache node]
- Who starts: `coordl cache-node start` (daemonised: redis-server forks, writes
  its pid file ``coordl-cache-node-<port>.pid`` in ``--dir`` and outlives the
  command) or a test fixture (a foreground child it stops itself).
- Who stops: `coordl cache-node stop` (SIGTERM to the pid in the pid file, after
  checking /proc that it is a redis-server) or the fixture. Redis exits at once
  on SIGTERM and writes nothing (no persistence); the pid file is removed.
- SIGKILL of the server: its memory is freed by the kernel, the pid file stays
  (stop and start recognise a dead pid and replace it); clients skip the node
  (cache/partitioned.py) and read those items from storage.
- A user's own Redis: coordl never starts, stops, configures or flushes it; it
  only reads and writes keys under ``coordl:<fingerprint>:`` and refuses a
  server whose eviction policy would evict them (`check_server`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import subprocess
import time
import urllib.parse
from typing import Any

from coordl.errors import CacheError, ConfigError

KEY_PREFIX = "coordl:"
META_SUFFIX = ":meta"
DEFAULT_PORT = 6390
#: Policies that never evict coordl's keys (they carry no TTL, so volatile-* never picks them).
SAFE_POLICIES = ("noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")
_LOOPBACK = ("localhost",)


def redis_module():
    """redis-py, or a clear error naming the extra to install."""
    try:
        import redis
    except ImportError:
        raise ConfigError("partitioned caching needs redis-py: pip install 'coordl[redis]' "
                          "(redis and hiredis)") from None
    return redis


def is_loopback(bind: str) -> bool:
    for addr in bind.split():
        if addr in _LOOPBACK:
            continue
        try:
            if not ipaddress.ip_address(addr.lstrip("-")).is_loopback:
                return False
        except ValueError:
            return False
    return True


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """A cache node's settings, validated once.

    port: TCP port; bind: addresses to listen on (space-separated, redis syntax);
    memory: ``maxmemory`` in bytes; password: required when `bind` is not loopback.
    """

    port: int = DEFAULT_PORT
    memory: int = 2**30
    bind: str = "127.0.0.1"
    password: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ConfigError(f"--port {self.port!r} must be a TCP port in 1..65535")
        if not (isinstance(self.memory, int) and self.memory >= 2**20):
            raise ConfigError(f"--memory {self.memory!r} must be at least 1MiB (the node's budget)")
        if not is_loopback(self.bind) and not self.password:
            raise ConfigError(f"--bind {self.bind} listens beyond loopback without a password: anyone who "
                              "reaches the port could read and write the cache; pass --password-file FILE "
                              "(and use TLS or a private network, see README 'Security')")

    def lines(self, directory: str, daemonize: bool) -> list[str]:
        """redis.conf lines (given on stdin: the password never shows in `ps`)."""
        lines = [f"port {self.port}", f"bind {self.bind}", "protected-mode yes",
                 f"maxmemory {self.memory}", "maxmemory-policy noeviction",
                 'save ""', "appendonly no", f'dir "{directory}"',
                 f"daemonize {'yes' if daemonize else 'no'}", "loglevel warning"]
        if daemonize:
            lines += [f'pidfile "{self.pidfile(directory)}"',
                      f'logfile "{os.path.join(directory, f"coordl-cache-node-{self.port}.log")}"']
        if self.password:
            lines.append("requirepass " + _quote(self.password))
        return lines

    def pidfile(self, directory: str) -> str:
        return os.path.join(directory, f"coordl-cache-node-{self.port}.pid")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if is_loopback(self.bind) else self.bind.split()[0]
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{host}:{self.port}/0"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def launch(cfg: NodeConfig, directory: str, daemonize: bool = False,
           executable: str = "redis-server") -> subprocess.Popen:
    """Start redis-server with `cfg`; a foreground child unless `daemonize` (then it exits at once)."""
    os.makedirs(directory, exist_ok=True)
    try:
        proc = subprocess.Popen([executable, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=directory)
    except FileNotFoundError:
        raise CacheError(f"{executable} is not installed: apt-get install redis-server "
                         "(or put redis-server on PATH)") from None
    proc.stdin.write(("\n".join(cfg.lines(directory, daemonize)) + "\n").encode())
    proc.stdin.close()
    return proc


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 20.0) -> None:
    """Until the server at `url` answers PING; a clear error if `proc` exits first or time runs out."""
    redis = redis_module()
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if proc is not None and proc.poll() not in (None, 0):
                    out = proc.stdout.read().decode(errors="replace").strip() if proc.stdout else ""
                    raise CacheError(f"redis-server for {redact(url)} exited with {proc.returncode}: "
                                     f"{out[-400:] or 'no output'}") from None
                if time.monotonic() > deadline:
                    raise CacheError(f"redis-server at {redact(url)} did not answer within {timeout:.0f}s") from None
                time.sleep(0.05)
    finally:
        client.close()


def redact(url: str) -> str:
    """The URL without its password."""
    head, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return head + sep + rest


def node_name(url: str) -> str:
    """A node's identity, for placement and for refusing one node listed twice: ``host:port/db``
    for TCP (host in lower case without a trailing dot, ``localhost`` as 127.0.0.1, an IP address
    in its canonical form; port 6379 and db 0 when the URL gives none) and ``unix:PATH/db`` for a
    socket (the path normalised); never the scheme, user or password. Raises ValueError (the reason)
    for a port or db that is not a number."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port  # ValueError: "Port could not be cast to integer value as 'x'"
    dbs = [parts.path.strip("/")] if parts.scheme != "unix" else []
    dbs += urllib.parse.parse_qs(parts.query).get("db", [])
    db = next((d for d in dbs if d), "0")
    if not db.isdigit():
        raise ValueError(f"db {db!r} is not a number (the URL's path /N or ?db=N)")
    if parts.scheme == "unix":
        return f"unix:{os.path.normpath(parts.path)}/{int(db)}"
    host = (parts.hostname or "").rstrip(".")
    host = "127.0.0.1" if host == "localhost" else host
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    return f"{f'[{host}]' if ':' in host else host}:{port or 6379}/{int(db)}"


def read_info(client) -> dict[str, Any]:
    """INFO server+memory+replication, as a dict."""
    info = dict(client.info("server"))
    info.update(client.info("memory"))
    info.update(client.info("replication"))
    return info


def check_server(url: str, info: dict[str, Any], capacity: int | None) -> None:
    """Refuse a server that is a replica (it refuses writes), whose policy would evict coordl's items,
    or that has no memory limit at all. Checked at construction and at every (re)connection."""
    role = str(info.get("role", "master"))
    if role != "master":
        primary = f" of {info.get('master_host', '?')}:{info.get('master_port', '?')}" if "master_host" in info else ""
        raise ConfigError(
            f"Redis at {redact(url)} is a read-only replica (role:{role}{primary}): it refuses every write "
            "(\"You can't write against a read only replica\"). Make it a primary again with "
            "REPLICAOF NO ONE, or list a primary (a node from `coordl cache-node start`)")
    policy = str(info.get("maxmemory_policy", "?"))
    if policy not in SAFE_POLICIES:
        raise ConfigError(
            f"Redis at {redact(url)} has maxmemory-policy {policy}: it would evict cached items to admit "
            "new ones, and under a random epoch order that thrashes exactly as the page cache does "
            "(hits far below the cached fraction). Set `maxmemory-policy noeviction` on it "
            "(CONFIG SET maxmemory-policy noeviction), or start a node with `coordl cache-node start`")
    if int(info.get("maxmemory", 0)) == 0 and capacity is None:
        raise ConfigError(
            f"Redis at {redact(url)} has no maxmemory (unlimited): the cache would grow until the server "
            "runs out of memory. Pass capacity_per_node= (e.g. '16GiB'), or set maxmemory on the server")


def datasets(client) -> dict[str, dict[str, str]]:
    """fingerprint prefix -> its meta hash (items, bytes, n_items, label, capacity) on this node.
    Reads only keys under ``coordl:*:meta`` (SCAN, never KEYS).
    A meta key that is not a hash, or whose items/bytes/n_items/capacity are not integers, is listed
    with a 'problem' entry (what is wrong and the fix) and without the bad fields."""
    out = {}
    for key in client.scan_iter(match=f"{KEY_PREFIX}*{META_SUFFIX}", count=1000):
        key = key.decode(errors="replace") if isinstance(key, bytes) else key
        fp = key[len(KEY_PREFIX):-len(META_SUFFIX)]
        fix = f"delete it (DEL {key}, or PartitionedCache.drop()): coordl rebuilds it as items are cached"
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "none":  # deleted since the SCAN
            continue
        if kind != "hash":
            out[fp] = {"problem": f"{key} is a {kind}, not coordl's hash: {fix}"}
            continue
        meta = {(k.decode(errors="replace") if isinstance(k, bytes) else k):
                (v.decode(errors="replace") if isinstance(v, bytes) else v) for k, v in client.hgetall(key).items()}
        bad = [f for f in ("items", "bytes", "n_items", "capacity") if f in meta and not meta[f].isdigit()]
        if bad:
            meta = {k: v for k, v in meta.items() if k not in bad}
            meta["problem"] = f"{key} holds {', '.join(bad)} that are not integers: {fix}"
        out[fp] = meta
    return out


def read_pid(cfg: NodeConfig, directory: str) -> int | None:
    """The pid in the node's pid file when it is a live redis-server, else None."""
    try:
        with open(cfg.pidfile(directory)) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except (OSError, ValueError):
        return None
    return pid if b"redis-server" in cmd else None


def stop_pid(pid: int, timeout: float = 20.0) -> bool:
    """SIGTERM a daemonised node (no persistence: it exits at once); True when it is gone."""
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)
    return False
