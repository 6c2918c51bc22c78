"""A cache node: a `redis-server` configured as a static store, and what is checked on one.

    cfg = NodeConfig(port=6390, memory=16 * 2**30)
    proc = launch(cfg, directory)            # redis-server, config on stdin (no password in argv)
    wait_ready(cfg.url, proc)                # PING answers
    info = read_info(client)                 # INFO server, memory, replication
    check_server(cfg.url, info, None)        # refuse a replica, an evicting policy, no limit
    datasets(client)                         # the coordl datasets on the node (their meta)

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
  `start` refuses a port something already listens on (naming it), and once
  the node answers records its pid, start time and port in
  ``coordl-cache-node-<port>.start`` (cache/partitioned/nodeproc.py).
- Who stops: `coordl cache-node stop` (SIGTERM, only to a pid that record proves:
  same start time, a redis-server command line naming the port) or the fixture.
  Redis exits at once on SIGTERM and writes nothing (no persistence); the pid
  file and the record are removed.
- SIGKILL of the server: its memory is freed by the kernel, the pid file and the
  record stay; the pid may be reused by any process, which the start time tells
  apart: stop signals nothing then, start starts a new node. Clients skip the
  node (cache/partitioned/cache.py) and read those items from storage.
- A user's own Redis: coordl never starts, stops, configures or flushes it; it
  only reads and writes keys under ``coordl:<fingerprint>:`` and refuses a
  server whose eviction policy would evict them (`check_server`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import re
import socket
import subprocess
import time
import urllib.parse
from typing import Any

from coordl.cache.shm import proc_start
from coordl.errors import CacheError, ConfigError

from ..redact import redact_url, scrub
from . import nodeproc, nodeurl

KEY_PREFIX = "coordl:"
META_SUFFIX = ":meta"
DEFAULT_PORT = 6390
#: Policies that never evict coordl's keys (they carry no TTL, so volatile-* never picks them).
SAFE_POLICIES = ("noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")
_LOOPBACK = ("localhost",)
#: What an ACL user of `coordl cache-node start --user` may run: PartitionedCache's reads, admission
#: script (and the commands inside it), node checks, membership record, stats, drop, and status.
ACL_COMMANDS = ("ping", "auth", "hello", "select", "client|setname", "info", "get", "mget",
                "set", "exists", "type", "hget", "hmget", "hgetall", "hincrby", "hsetnx", "scan", "unlink",
                "evalsha", "eval", "script|load", "script|exists")


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
    tls_cert, tls_key: the server's certificate and key (PEM): the node then speaks TLS only, on
    `port` (redis ``port 0``, ``tls-port``); tls_ca: the CA that client certificates must be
    signed by (``tls-auth-clients yes``: mutual TLS); without it clients need no certificate.
    user: an ACL user (with `password`) allowed only the commands and keys coordl uses
    (`ACL_COMMANDS`, keys ``coordl:*``); the default user is then off.
    """

    port: int = DEFAULT_PORT
    memory: int = 2**30
    bind: str = "127.0.0.1"
    password: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ConfigError(f"--port {self.port!r} must be a TCP port in 1..65535")
        if not (isinstance(self.memory, int) and self.memory >= 2**20):
            raise ConfigError(f"--cache {self.memory!r} must be at least 1MiB (the node's budget)")
        if not is_loopback(self.bind) and not self.password:
            raise ConfigError(f"--bind {self.bind} listens beyond loopback without a password: anyone who "
                              "reaches the port could read and write the cache; pass --password-file FILE "
                              "(and use TLS or a private network, see docs/partitioned-cache.md, 'Security')")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together: give the server's certificate and its key")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-ca needs --tls-cert and --tls-key (the server's own certificate and key)")
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key), ("--tls-ca", self.tls_ca)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{flag} {path}: no such file: give a PEM file")
        if self.user is not None:
            if not self.password:
                raise ConfigError(f"--user {self.user} needs --password-file: an ACL user logs in with a password")
            if not self.user or any(c.isspace() or c in "@:/%" or not c.isprintable() for c in self.user):
                raise ConfigError(f"--user {self.user!r}: use letters, digits, '-', '_' or '.' (no spaces, "
                                  "no '@ : / %')")

    def lines(self, directory: str, daemonize: bool) -> list[str]:
        """redis.conf lines (given on stdin: the password never shows in `ps`)."""
        port = [f"port {self.port}"] if not self.tls_cert else [
            "port 0", f"tls-port {self.port}", f"tls-cert-file {_quote(os.path.abspath(self.tls_cert))}",
            f"tls-key-file {_quote(os.path.abspath(self.tls_key or ''))}",
            f"tls-auth-clients {'yes' if self.tls_ca else 'no'}"]
        if self.tls_ca:
            port.append(f"tls-ca-cert-file {_quote(os.path.abspath(self.tls_ca))}")
        lines = [*port, f"bind {self.bind}", "protected-mode yes",
                 f"maxmemory {self.memory}", "maxmemory-policy noeviction",
                 'save ""', "appendonly no", f'dir "{directory}"',
                 f"daemonize {'yes' if daemonize else 'no'}", "loglevel warning"]
        if daemonize:
            lines += [f'pidfile "{self.pidfile(directory)}"',
                      f'logfile "{os.path.join(directory, f"coordl-cache-node-{self.port}.log")}"']
        if self.user:
            digest = hashlib.sha256((self.password or "").encode()).hexdigest()  # no quoting of the password at all
            lines += ["user default off", f"user {self.user} on #{digest} ~coordl:* resetchannels -@all "
                      + " ".join(f"+{c}" for c in ACL_COMMANDS)]
        elif self.password:
            lines.append("requirepass " + _quote(self.password))
        return lines

    def client_tls(self) -> dict[str, object]:
        """redis-py TLS options for this machine's own check of the node (`wait_ready`): the CA when
        given (else the self-signed certificate is not verified: the pid proves the server), and
        the server's own certificate as the client's one under mutual TLS."""
        if not self.tls_cert:
            return {}
        opts: dict[str, object] = {"ssl_check_hostname": False}
        if self.tls_ca:
            opts.update(ssl_ca_certs=self.tls_ca, ssl_certfile=self.tls_cert, ssl_keyfile=self.tls_key)
        else:
            opts["ssl_cert_reqs"] = "none"
        return opts

    def pidfile(self, directory: str) -> str:
        """redis-server's own pid file (it writes it once listening, removes it at a clean exit)."""
        return os.path.join(directory, f"coordl-cache-node-{self.port}.pid")

    def recordfile(self, directory: str) -> str:
        """coordl's proof of the node: pid, start time and port (cache/partitioned/nodeproc.py)."""
        return os.path.join(directory, f"coordl-cache-node-{self.port}.start")

    @property
    def url(self) -> str:
        """The node's URL, the password percent-encoded (any password works)."""
        host = "127.0.0.1" if is_loopback(self.bind) else self.bind.split()[0].lstrip("-")
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "*") else host
        return nodeurl.node_url(host, self.port, self.password, scheme="rediss" if self.tls_cert else "redis",
                                user=self.user)


def _quote(s: str) -> str:
    """`s` as one redis.conf argument: double-quoted, backslash and quote escaped, control
    characters (a newline would end the line) as \\xHH, which redis reads back as that byte."""
    body = s.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c for c in body) + '"'


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
    stdin = proc.stdin
    if stdin is None:  # Popen(stdin=PIPE) always gives one
        raise CacheError(f"{executable}: no stdin pipe to send the configuration on")
    stdin.write(("\n".join(cfg.lines(directory, daemonize)) + "\n").encode())
    stdin.close()
    return proc


def daemon_pid(cfg: NodeConfig, directory: str, timeout: float = 20.0) -> int:
    """The pid of the node `launch(..., daemonize=True)` started: once redis-server has written its
    pid file (it does so after it listens) and that pid is a redis-server on cfg.port. A clear error
    with the log's tail when it does not come up (it exits at once when it cannot listen)."""
    log = os.path.join(directory, f"coordl-cache-node-{cfg.port}.log")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(cfg.pidfile(directory)) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and nodeproc.serves_port(nodeproc.cmdline(pid), cfg.port):
            return pid
        if time.monotonic() > deadline:
            try:
                with open(log, errors="replace") as f:
                    tail = f.read()[-400:].strip()
            except OSError:
                tail = ""
            raise CacheError(f"redis-server on port {cfg.port} did not come up within {timeout:.0f}s "
                             f"(no live pid in {cfg.pidfile(directory)}); its log {log} ends: "
                             f"{tail or 'nothing'}")
        time.sleep(0.05)


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 20.0,
               pid: int | None = None, tls: dict | None = None) -> None:
    """Until the server at `url` answers PING; a clear error (no password in it) if `proc` exits
    first, authentication fails or time runs out. With `pid`: the server answering must be that
    process (INFO process_id), not another one on the port."""
    redis = redis_module()
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0, **(tls or {}))
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                break
            except redis.AuthenticationError as e:
                raise CacheError(f"redis-server at {redact_url(url)}: {nodeurl.explain(url, e)}") from None
            except redis.ConnectionError as e:
                if proc is not None and proc.poll() not in (None, 0):
                    out = proc.stdout.read().decode(errors="replace").strip() if proc.stdout else ""
                    raise CacheError(f"redis-server for {redact_url(url)} exited with {proc.returncode}: "
                                     f"{scrub(out[-400:], url) or 'no output'}") from None
                if time.monotonic() > deadline:
                    raise CacheError(f"redis-server at {redact_url(url)} did not answer within {timeout:.0f}s: "
                                     f"{scrub(str(e), url)}") from None
                time.sleep(0.05)
        answering = int(client.info("server").get("process_id", -1)) if pid is not None else None
    except redis.RedisError as e:
        raise CacheError(f"redis-server at {redact_url(url)}: {scrub(str(e), url)}") from None
    finally:
        client.close()
    if pid is not None and answering != pid:
        raise CacheError(f"{redact_url(url)} is answered by pid {answering}, not by the node just started "
                         f"(pid {pid}): another server holds the port; pick another --port")


def node_name(url: str) -> str:
    """A node's identity, for placement and for refusing one node listed twice: ``host:port/db``
    for TCP (the host as `canonical_host` spells it; port 6379 and db 0 when the URL gives none)
    and ``unix:PATH/db`` for a socket (the path normalised); never the scheme, user or password.
    Raises ValueError (the reason) for a port or db that is not a number."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port  # ValueError: "Port could not be cast to integer value as 'x'"
    dbs = [parts.path.strip("/")] if parts.scheme != "unix" else []
    dbs += urllib.parse.parse_qs(parts.query).get("db", [])
    db = next((d for d in dbs if d), "0")
    if not db.isdigit():
        raise ValueError(f"db {db!r} is not a number (the URL's path /N or ?db=N)")
    if parts.scheme == "unix":
        return f"unix:{os.path.normpath(parts.path)}/{int(db)}"
    host = canonical_host(parts.hostname or "")
    return f"{f'[{host}]' if ':' in host else host}:{port or 6379}/{int(db)}"


_NUMERIC_V4 = re.compile(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}")


def canonical_host(host: str) -> str:
    """The one spelling of a host: lower case without a trailing dot, ``localhost`` as 127.0.0.1,
    an IPv4 address in dotted quad whatever form the resolver takes (``127.1``, ``0x7f.0.0.1``,
    ``2130706433``: what `socket.inet_aton` reads, as getaddrinfo does), an IPv4-mapped IPv6 address
    (``::ffff:127.0.0.1``) as its IPv4 address, any other IPv6 address compressed."""
    host = host.lower().rstrip(".")
    if host == "localhost":
        return "127.0.0.1"
    if _NUMERIC_V4.fullmatch(host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:  # a part out of range (127.256): not an address; left as written
            return host
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host
    mapped = getattr(addr, "ipv4_mapped", None)
    return str(mapped) if mapped is not None else addr.compressed


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
            f"Redis at {redact_url(url)} is a read-only replica (role:{role}{primary}): it refuses every write "
            "(\"You can't write against a read only replica\"). Make it a primary again with "
            "REPLICAOF NO ONE, or list a primary (a node from `coordl cache-node start`)")
    policy = str(info.get("maxmemory_policy", "?"))
    if policy not in SAFE_POLICIES:
        raise ConfigError(
            f"Redis at {redact_url(url)} has maxmemory-policy {policy}: it would evict cached items to admit "
            "new ones, and under a random epoch order that thrashes exactly as the page cache does "
            "(hits far below the cached fraction). Set `maxmemory-policy noeviction` on it "
            "(CONFIG SET maxmemory-policy noeviction), or start a node with `coordl cache-node start`")
    if int(info.get("maxmemory", 0)) == 0 and capacity is None:
        raise ConfigError(
            f"Redis at {redact_url(url)} has no maxmemory (unlimited): the cache would grow until the server "
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
    """The node's pid when its start record proves it (same pid, start time, a redis-server on
    cfg.port: cache/partitioned/nodeproc.py), else None. See `node_pid` for why not."""
    return node_pid(cfg, directory)[0]


def node_pid(cfg: NodeConfig, directory: str) -> tuple[int | None, str]:
    """(pid, "") of the node `coordl cache-node start` recorded in `directory`, or (None, why not)."""
    return nodeproc.proven(cfg.recordfile(directory), cfg.port)


def stop_pid(pid: int, timeout: float = 20.0, start: int | None = None) -> bool:
    """SIGTERM a daemonised node (no persistence: it exits at once); True when it is gone.
    With `start`: nothing is signalled unless pid still has that start time (not a reused pid)."""
    if start is not None and proc_start(pid) != start:
        return True
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
