"""Which process is a cache node, and who holds a TCP port (Linux /proc, no extra dependency).

    holder = port_holder("127.0.0.1", 6390)     # None, or "redis-server 127.0.0.1:6390 (pid 812)"
    write_record(path, pid, port)               # pid + start time + port, at `coordl cache-node start`
    pid, why = proven(path, port)               # pid only when all three still match

A pid alone proves nothing: after a SIGKILL the pid file stays, and the kernel
hands the number to the next process (an unrelated redis-server, say).
`coordl cache-node stop` signals a pid only when the record written at start
still matches it: the same start time (``/proc/<pid>/stat`` field 22, as
cache/shm.alive checks segment owners), and a command line that is
redis-server's and names the node's port (redis-server sets its title to
``redis-server ADDR:PORT``).
"""

from __future__ import annotations

import errno
import json
import os
import socket

from coordl.cache.shm import proc_start

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def cmdline(pid: int) -> str | None:
    """The process's command line, arguments joined by spaces (None: gone or not readable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or None


def serves_port(line: str | None, port: int) -> bool:
    """Is `line` a redis-server's command line naming `port` (its title ``redis-server ADDR:PORT``)?"""
    if not line:
        return False
    words = line.split()
    return os.path.basename(words[0]).startswith("redis-server") and any(
        w.endswith(f":{port}") for w in words[1:])


def _bind_addresses(bind: str) -> list[str]:
    addrs = [a.lstrip("-") for a in bind.split()] or ["127.0.0.1"]
    return ["127.0.0.1" if a == "localhost" else a for a in addrs]


def port_busy(bind: str, port: int) -> bool:
    """Would redis-server fail to listen on `port` at the `bind` addresses (EADDRINUSE)?
    Binds as redis does (SO_REUSEADDR: a port in TIME_WAIT is free)."""
    for addr in _bind_addresses(bind):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((addr, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
                if e.errno != errno.EADDRNOTAVAIL:  # an address not on this machine: redis reports it
                    raise
    return False


def _listen_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def listeners(port: int) -> list[int]:
    """Pids of the processes (of this user; others' fds are not readable) listening on TCP `port`."""
    wanted = {f"socket:[{i}]" for i in _listen_inodes(port)}
    pids = []
    for name in os.listdir("/proc") if wanted else ():
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") in wanted:
                    pids.append(int(name))
                    break
            except OSError:
                continue
    return sorted(pids)


def port_holder(bind: str, port: int) -> str | None:
    """None when `port` is free at `bind`; else what listens there, as precisely as /proc tells."""
    if not port_busy(bind, port):
        return None
    pids = listeners(port)
    if not pids:
        return (f"a process this user cannot see (another user's or the system's; "
                f"`sudo ss -ltnp 'sport = :{port}'` names it)")
    return ", ".join(f"{cmdline(p) or '?'} (pid {p})" for p in pids)


def write_record(path: str, pid: int, port: int) -> None:
    """Record the node's pid, start time and port (written once the node answers, atomically)."""
    start = proc_start(pid)
    if start is None:
        raise ProcessLookupError(pid)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"pid": pid, "start": start, "port": port}, f)
    os.replace(tmp, path)


def read_record(path: str) -> dict | None:
    """The record at `path` (None: missing or not a record coordl wrote)."""
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(rec, dict) and all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool)
                                       for k in ("pid", "start", "port"))
    return rec if ok else None


def proven(path: str, port: int) -> tuple[int | None, str]:
    """(pid, "") when the record at `path` names a live process with the recorded start time whose
    command line is redis-server on `port`; else (None, why not)."""
    rec = read_record(path)
    if rec is None:
        return None, f"no start record {path} (written by `coordl cache-node start`)"
    pid = rec["pid"]
    if rec["port"] != port:
        return None, f"the record {path} is for port {rec['port']}, not {port}"
    start = proc_start(pid)
    if start is None:
        return None, f"pid {pid} is no longer running"
    if start != rec["start"]:
        return None, (f"pid {pid} has start time {start}, not the recorded {rec['start']}: "
                      "the number was reused by another process")
    line = cmdline(pid)
    if not serves_port(line, port):
        return None, f"pid {pid} is `{line}`, not a redis-server on :{port}"
    return pid, ""
