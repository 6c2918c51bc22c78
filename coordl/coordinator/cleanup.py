"""Remove what a coordinator daemon killed without a shutdown left behind.

A daemon stopped by SIGTERM/SIGINT removes its own segments and socket. One
killed by SIGKILL (or the OOM killer) cannot: its ring segment stays in
/dev/shm and its socket file stays on disk. A segment's name carries the
daemon's pid and start time (segments.py), so whether its owner lives is
known from the name alone; the ring records the socket path. Segments of a
living daemon, or of another user, are never touched (`coordl cleanup` lists
the other users' as skipped: `coordl.cache.shm.others`).
"""

from __future__ import annotations

import os

from coordl.cache import shm

from . import segments
from .ring import Ring


def _stale_socket(path: str) -> bool:
    """Is `path` a socket of ours that nobody accepts on?"""
    try:
        return shm.owner_uid(path) == os.getuid() and shm.socket_state(path) == shm.STALE
    except OSError:
        return False  # cannot tell (no permission, a timeout): leave it


def stale_segments(directory: str = shm.SHM_DIR) -> list[str]:
    """Names of this user's coordinator segments whose daemon is gone."""
    return [name for name in shm.list_names(directory, segments.PREFIX)
            if shm.owner_uid(os.path.join(directory, name)) == os.getuid()
            and not segments.owner_alive(name)]


SEGMENT = "coordinator segment"
SOCKET = "coordinator socket"


def cleanup(directory: str = shm.SHM_DIR, dry_run: bool = False) -> list[shm.Removed]:
    """Remove dead daemons' segments and stale sockets (wherever the socket was); what was removed
    (or would be)."""
    removed = []
    for name in stale_segments(directory):
        path = os.path.join(directory, name)
        sock = Ring.read_socket_path(path)
        if sock is not None and _stale_socket(sock):
            if not dry_run:
                segments.unlink(sock)
            removed.append(shm.Removed(SOCKET, sock))
        if dry_run or segments.unlink(path):
            removed.append(shm.Removed(SEGMENT, path))
    return removed
