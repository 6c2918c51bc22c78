"""`coordl cache-node start|stop|status`: the Redis cache nodes of partitioned caching.

    coordl cache-node start --cache 16GiB                       # loopback only, port 6390
    coordl cache-node start --cache 16GiB --bind 10.0.0.5 --password-file ~/.coordl-pw
    coordl cache-node status redis://:PW@host1:6390/0 redis://:PW@host2:6390/0
    coordl cache-node stop

(`--memory` is the old name of `--cache`, still accepted.) The server's configuration and
lifecycle are in `coordl.cache.partitioned.redisnode`; which process is a node, and who holds a port, in
`coordl.cache.partitioned.nodeproc`; URLs with passwords in `coordl.cache.partitioned.nodeurl`. No message prints a
password: URLs are shown as redis://***@host:port/db and errors are scrubbed.
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile

import click

from coordl.cache.partitioned import membership, nodeproc, nodetls, nodeurl, redisnode
from coordl.cache.redact import redact_url, scrub
from coordl.cache.sizes import fmt_bytes, parse_size
from coordl.errors import CacheError, ConfigError

_DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "coordl-cache-node")
_PORT = click.option("--port", type=int, default=redisnode.DEFAULT_PORT, show_default=True, help="TCP port.")
_DIR = click.option("--dir", "directory", default=_DEFAULT_DIR, show_default=True,
                    type=click.Path(file_okay=False), help="Folder of the node's pid and log files.")


def _password(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"--password-file {path}: cannot read it ({e.strerror}): pass a readable file") from None
    password = text[:-1] if text.endswith("\n") else text   # the line's end only: any other character counts
    password = password[:-1] if password.endswith("\r") else password
    if not password.strip():
        raise ConfigError(f"--password-file {path} is empty: write the password into it (one line)")
    if "\n" in password:
        raise ConfigError(f"--password-file {path} holds more than one line: write the password alone on one line")
    if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        click.echo(f"coordl: warning: {path} is readable by other users: chmod 600 {path}", err=True)
    return password


@click.group("cache-node")
def cache_node_group() -> None:
    """Redis cache nodes for coordl.PartitionedCache (one per training server)."""


@cache_node_group.command("start")
@click.option("--cache", "--memory", "cache", required=True,
              help="The node's budget: maxmemory, e.g. 16GiB (--memory: the old name).")
@_PORT
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Addresses to listen on (beyond loopback a password is required).")
@click.option("--password-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the password clients must give (requirepass).")
@click.option("--user", default=None,
              help="An ACL user (password from --password-file) allowed only coordl's commands on coordl:* "
                   "keys; the default user is turned off. URL: redis://USER:PASSWORD@host:port/0.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
              help="Server certificate (PEM): the node speaks TLS only, on --port (URL: rediss://).")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="The server certificate's key (PEM).")
@click.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
              help="CA (PEM) that client certificates must be signed by: mutual TLS (tls-auth-clients yes).")
@_DIR
def start_cmd(cache: str, port: int, bind: str, password_file: str | None, user: str | None,
              tls_cert: str | None, tls_key: str | None, tls_ca: str | None, directory: str) -> None:
    """Start a redis-server as a static cache node and print its URL."""
    cfg = redisnode.NodeConfig(port=port, memory=parse_size(cache, "--cache"), bind=bind,
                               password=_password(password_file), tls_cert=tls_cert, tls_key=tls_key,
                               tls_ca=tls_ca, user=user)
    if cfg.tls_cert:  # redis-server starts with any dates, and then no client accepts the node
        nodetls.check_certificate(cfg.tls_cert, "--tls-cert", "the server certificate")
    directory = os.path.abspath(directory)
    running = redisnode.read_pid(cfg, directory)
    if running is not None:
        raise CacheError(f"a cache node already runs on port {port} (pid {running}): "
                         f"`coordl cache-node stop --port {port}` first, or pick another --port")
    holder = nodeproc.port_holder(bind, port)
    if holder is not None:
        raise CacheError(f"port {port} is in use by {holder}: pick a free port (--port N), "
                         "or stop what listens there")
    _remove(cfg.pidfile(directory), cfg.recordfile(directory))  # a dead node's, proven not live above
    proc = redisnode.launch(cfg, directory, daemonize=True)
    stdout = proc.stdout
    out = stdout.read() if stdout is not None else b""  # redis-server forks; the parent's output ends when it exits
    proc.wait(timeout=60)
    if stdout is not None:
        stdout.close()
    if proc.returncode != 0:
        raise CacheError(f"redis-server did not start on port {port}: "
                         f"{scrub(out.decode(errors='replace').strip()[-400:], cfg.url) or 'no output'}")
    pid = redisnode.daemon_pid(cfg, directory)
    try:
        redisnode.wait_ready(cfg.url, pid=pid, tls=cfg.client_tls())
        nodeproc.write_record(cfg.recordfile(directory), pid, port)
    except BaseException:
        redisnode.stop_pid(pid)   # just seen as redis-server on this port, started by us
        _remove(cfg.recordfile(directory))
        raise
    shown = redact_url(cfg.url)
    if not redisnode.is_loopback(bind) and bind.split()[0] in ("0.0.0.0", "::"):
        shown = shown.replace("127.0.0.1", socket.getfqdn())
    click.echo(shown)
    click.echo(f"  maxmemory {fmt_bytes(cfg.memory)}, noeviction, no persistence; pid {pid}"
               + (f"; password from {password_file} (URL: redis{'s' if tls_cert else ''}://"
                  f"{user or ''}:PASSWORD@..., the password percent-encoded)" if password_file else ""))
    if tls_cert:
        click.echo("  TLS only (no plain port); clients verify the server against the CA that signed "
                   f"{tls_cert} (ssl_ca_certs=)"
                   + (f"; clients need a certificate signed by {tls_ca} (ssl_certfile=, ssl_keyfile=)"
                      if tls_ca else ""))
    if user:
        click.echo(f"  ACL user {user}: only coordl's commands, keys coordl:*; the default user is off")


def _remove(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@cache_node_group.command("stop")
@_PORT
@_DIR
def stop_cmd(port: int, directory: str) -> None:
    """Stop the cache node started on --port (its cached items are dropped).

    Only a process proven to be that node is signalled: the pid, its start time and its port
    as recorded by `start`; a stale pid file naming any other process is left alone."""
    cfg = redisnode.NodeConfig(port=port)
    pid, why = redisnode.node_pid(cfg, directory)
    record = nodeproc.read_record(cfg.recordfile(directory))
    if pid is None or record is None:
        _not_proven(cfg, directory, why)
        return
    start = record["start"]
    if not redisnode.stop_pid(pid, start=start):
        raise CacheError(f"cache node on port {port} (pid {pid}) did not exit: kill {pid}")
    _remove(cfg.pidfile(directory), cfg.recordfile(directory))
    click.echo(f"stopped cache node on port {port} (pid {pid})")


def _not_proven(cfg: redisnode.NodeConfig, directory: str, why: str) -> None:
    """Raise the error of `stop` when no node is proven on cfg.port; stale files are removed only
    when they name no live process."""
    pidfile = cfg.pidfile(directory)
    try:
        with open(pidfile) as f:
            named = int(f.read().strip())
    except (OSError, ValueError):
        named = None
    line = nodeproc.cmdline(named) if named is not None else None
    if line is not None:
        raise CacheError(f"not signalled: {pidfile} names pid {named} (`{line}`), which coordl cannot prove "
                         f"is the node it started on port {cfg.port}: {why}. If that process is your node, "
                         f"stop it yourself (kill {named}); then remove {pidfile}")
    stale = [p for p in (pidfile, cfg.recordfile(directory)) if os.path.exists(p)]
    _remove(*stale)
    raise CacheError(f"no cache node runs on port {cfg.port} ({why}"
                     + (f"; removed the stale {', '.join(stale)}" if stale else "")
                     + "); see `coordl cache-node status`")


def _client_tls(f):
    for opt in reversed((
            click.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
                         help="CA (PEM) that signed the nodes' certificates (rediss:// URLs)."),
            click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
                         help="Client certificate (PEM), for nodes that require one (mutual TLS)."),
            click.option("--tls-key", type=click.Path(dir_okay=False), default=None,
                         help="The client certificate's key (PEM)."))):
        f = opt(f)
    return f


def _client(url: str, tls: dict, timeout: float = 2.0):
    redis = redisnode.redis_module()
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                **(tls if url.startswith("rediss:") else {}))


def _run_id(url: str, tls: dict) -> str | None:
    """The INFO run_id of the server at `url` (which tells one server under two spellings), None
    when it cannot be read (the node's error is then shown by the command itself)."""
    redis = redisnode.redis_module()
    try:
        client = _client(url, tls)
        try:
            return str(client.info("server").get("run_id") or "") or None
        finally:
            client.close()
    except redis.RedisError:
        return None


@cache_node_group.command("status")
@click.argument("urls", nargs=-1)
@_client_tls
def status_cmd(urls: tuple[str, ...], tls_ca: str | None, tls_cert: str | None, tls_key: str | None) -> None:
    """Memory, policy and coordl datasets of each node (default: this server's, port 6390)."""
    redis = redisnode.redis_module()
    tls = nodetls.options(urls or ("rediss://",), tls_ca, tls_cert, tls_key)
    failed = 0
    for url in urls or (f"redis://127.0.0.1:{redisnode.DEFAULT_PORT}/0",):
        shown = redact_url(url)
        problem = nodeurl.url_problem(url)
        if problem:
            click.echo(f"{shown}\n  bad URL: {problem}")
            failed += 1
            continue
        try:
            client = _client(url, tls)
            try:
                info = redisnode.read_info(client)
                found = redisnode.datasets(client)
            finally:
                client.close()
        except ValueError as e:
            click.echo(f"{shown}\n  bad URL: {scrub(str(e), url)}")
            failed += 1
            continue
        except redis.RedisError as e:
            click.echo(f"{shown}\n  {nodeurl.explain(url, e)}")
            failed += 1
            continue
        used, cap = int(info["used_memory"]), int(info.get("maxmemory", 0))
        free = f"{fmt_bytes(max(cap - used, 0))} free of {fmt_bytes(cap)}" if cap else "no maxmemory (unlimited)"
        click.echo(f"{shown}\n  redis       {info.get('redis_version', '?')}, "
                   f"maxmemory-policy {info.get('maxmemory_policy', '?')}\n"
                   f"  memory      {fmt_bytes(used)} used, {free}")
        if not found:
            click.echo("  datasets    none")
        for fp, meta in sorted(found.items()):
            label = meta.get("label", "")
            click.echo(f"  dataset     {fp[:16]}  {meta.get('items', 0)} keys of {meta.get('n_items', '?')} items, "
                       f"{fmt_bytes(int(meta.get('bytes', 0)))}{'  ' + label if label else ''}")
            if meta.get("problem"):
                click.echo(f"              problem: {meta['problem']}")
    if failed:
        raise CacheError(f"{failed} of {len(urls) or 1} cache node(s) could not be read (see above)")


@cache_node_group.command("members")
@click.argument("urls", nargs=-1, required=True)
@click.option("--update", is_flag=True,
              help="Write this list into every node of it (after adding, removing or replacing a node).")
@_client_tls
def members_cmd(urls: tuple[str, ...], update: bool, tls_ca: str | None, tls_cert: str | None,
                tls_key: str | None) -> None:
    """The node list each node belongs to, against URLS (the list every rank passes as nodes=).

    Without --update it only reads, and fails when a node belongs to another list. With --update
    (between epochs, no job running) it writes URLS as the list of every node in it; the nodes
    that stay keep their cached items (docs/partitioned-cache.md, 'Adding, removing or replacing a cache node')."""
    from coordl.cache.partitioned.cache import check_nodes

    redis = redisnode.redis_module()
    nodes = check_nodes(list(urls))   # a node twice, a bad URL: ConfigError
    tls = nodetls.options(nodes, tls_ca, tls_cert, tls_key)
    names = [redisnode.node_name(u) for u in nodes]
    membership.one_server_each([redact_url(u) for u in nodes], [_run_id(u, tls) for u in nodes])
    failed = 0
    for url in nodes:
        shown = redact_url(url)
        try:
            client = _client(url, tls)
            try:
                if update:
                    done = membership.agree(client, shown, names, update=True)
                else:
                    theirs = membership.read(client)
                    done = ("no list yet (the first PartitionedCache writes it)" if theirs is None else "same"
                            if membership.record(theirs) == membership.record(names)
                            else f"DIFFERS: {membership.difference(names, theirs)}")
            finally:
                client.close()
        except redis.RedisError as e:
            click.echo(f"{shown}\n  {nodeurl.explain(url, e)}")
            failed += 1
            continue
        click.echo(f"{shown}\n  node list: {done}")
        failed += done.startswith("DIFFERS")
    if failed:
        raise CacheError(f"{failed} of {len(nodes)} cache node(s) do not agree with this list or could not be "
                         "read (see above)" + ("" if update else "; after a deliberate change, run again "
                                                "with --update"))
    if update:
        click.echo(f"{len(nodes)} node(s) now belong to this list of {len(nodes)}; pass the same list as "
                   "nodes= on every rank")
