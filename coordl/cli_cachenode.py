"""`coordl cache-node start|stop|status`: the Redis cache nodes of partitioned caching.

    coordl cache-node start --memory 16GiB                      # loopback only, port 6390
    coordl cache-node start --memory 16GiB --bind 10.0.0.5 --password-file ~/.coordl-pw
    coordl cache-node status redis://:PW@host1:6390/0 redis://:PW@host2:6390/0
    coordl cache-node stop

The server's configuration and lifecycle are in `coordl.cache.redisnode`.
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile

import click

from coordl.cache import redisnode

from .caching import parse_size
from .errors import CacheError, ConfigError

_DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "coordl-cache-node")
_PORT = click.option("--port", type=int, default=redisnode.DEFAULT_PORT, show_default=True, help="TCP port.")
_DIR = click.option("--dir", "directory", default=_DEFAULT_DIR, show_default=True,
                    type=click.Path(file_okay=False), help="Folder of the node's pid and log files.")


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _password(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
        with open(path) as f:
            password = f.read().strip()
    except OSError as e:
        raise ConfigError(f"--password-file {path}: cannot read it ({e.strerror}): pass a readable file") from None
    if not password:
        raise ConfigError(f"--password-file {path} is empty: write the password into it (one line)")
    if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        click.echo(f"coordl: warning: {path} is readable by other users: chmod 600 {path}", err=True)
    return password


@click.group("cache-node")
def cache_node_group() -> None:
    """Redis cache nodes for coordl.PartitionedCache (one per training server)."""


@cache_node_group.command("start")
@click.option("--memory", required=True, help="The node's budget: maxmemory, e.g. 16GiB.")
@_PORT
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Addresses to listen on (beyond loopback a password is required).")
@click.option("--password-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the password clients must give (requirepass).")
@_DIR
def start_cmd(memory: str, port: int, bind: str, password_file: str | None, directory: str) -> None:
    """Start a redis-server as a static cache node and print its URL."""
    cfg = redisnode.NodeConfig(port=port, memory=parse_size(memory, "--memory"), bind=bind,
                               password=_password(password_file))
    running = redisnode.read_pid(cfg, directory)
    if running is not None:
        raise CacheError(f"a cache node already runs on port {port} (pid {running}): "
                         f"`coordl cache-node stop --port {port}` first, or pick another --port")
    proc = redisnode.launch(cfg, os.path.abspath(directory), daemonize=True)
    out = proc.stdout.read()      # redis-server forks; the parent's output ends when it exits
    proc.wait(timeout=60)
    proc.stdout.close()
    if proc.returncode != 0:
        raise CacheError(f"redis-server did not start on port {port}: "
                         f"{out.decode(errors='replace').strip()[-400:] or 'no output'}")
    redisnode.wait_ready(cfg.url)
    shown = redisnode.redact(cfg.url)
    if not redisnode.is_loopback(bind) and bind.split()[0] in ("0.0.0.0", "::"):
        shown = shown.replace("127.0.0.1", socket.getfqdn())
    click.echo(shown)
    click.echo(f"  maxmemory {_fmt(cfg.memory)}, noeviction, no persistence; pid {redisnode.read_pid(cfg, directory)}"
               + (f"; password from {password_file} (URL: redis://:PASSWORD@...)" if password_file else ""))


@cache_node_group.command("stop")
@_PORT
@_DIR
def stop_cmd(port: int, directory: str) -> None:
    """Stop the cache node started on --port (its cached items are dropped)."""
    cfg = redisnode.NodeConfig(port=port)
    pid = redisnode.read_pid(cfg, directory)
    if pid is None:
        raise CacheError(f"no cache node runs on port {port} (no live redis-server pid in "
                         f"{cfg.pidfile(directory)}); see `coordl cache-node status`")
    if not redisnode.stop_pid(pid):
        raise CacheError(f"cache node on port {port} (pid {pid}) did not exit: kill {pid}")
    try:
        os.unlink(cfg.pidfile(directory))
    except FileNotFoundError:
        pass
    click.echo(f"stopped cache node on port {port} (pid {pid})")


@cache_node_group.command("status")
@click.argument("urls", nargs=-1)
def status_cmd(urls: tuple[str, ...]) -> None:
    """Memory, policy and coordl datasets of each node (default: this server's, port 6390)."""
    redis = redisnode.redis_module()
    failed = 0
    for url in urls or (f"redis://127.0.0.1:{redisnode.DEFAULT_PORT}/0",):
        shown = redisnode.redact(url)
        try:
            client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
            info = redisnode.read_info(client)
            found = redisnode.datasets(client)
            client.close()
        except (redis.RedisError, ValueError) as e:
            click.echo(f"{shown}\n  unreachable: {e}")
            failed += 1
            continue
        used, cap = int(info["used_memory"]), int(info.get("maxmemory", 0))
        free = f"{_fmt(max(cap - used, 0))} free of {_fmt(cap)}" if cap else "no maxmemory (unlimited)"
        click.echo(f"{shown}\n  redis       {info.get('redis_version', '?')}, "
                   f"maxmemory-policy {info.get('maxmemory_policy', '?')}\n"
                   f"  memory      {_fmt(used)} used, {free}")
        if not found:
            click.echo("  datasets    none")
        for fp, meta in sorted(found.items()):
            label = meta.get("label", "")
            click.echo(f"  dataset     {fp[:16]}  {meta.get('items', 0)} keys of {meta.get('n_items', '?')} items, "
                       f"{_fmt(int(meta.get('bytes', 0)))}{'  ' + label if label else ''}")
    if failed:
        raise CacheError(f"{failed} of {len(urls) or 1} cache node(s) did not answer")
