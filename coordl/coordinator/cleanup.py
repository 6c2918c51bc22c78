"""Remove what a coordinator daemon killed without a shutdown left behind.

A daemon stopped by SIGTERM/SIGINT removes its own segments and socket. One
killed by SIGKILL (or the OOM killer) cannot: its ring segment stays in
/dev/shm and its socket file stays on disk. A segment's name carries the
daemon's pid and start time (segments.py), so whether its owner lives is
known from the name alone; the ring records the socket path. Segments of a
living daemon, or of another user, are never touched.
"""

from __future__ import annotations

import os
import socket
import stat

from . import segments
from .ring import Ring


def _stale_socket(path: str) -> bool:
    """Is `path` a socket of ours that nobody accepts on?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()


def stale_segments(directory: str = segments.SHM_DIR) -> list[str]:
    """Names of this user's coordinator segments whose daemon is gone."""
    out = []
    for name in segments.list_ours(directory):
        try:
            st = os.lstat(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        if st.st_uid == os.getuid() and not segments.owner_alive(name):
            out.append(name)
    return out


def cleanup(directory: str = segments.SHM_DIR, dry_run: bool = False) -> list[str]:
    """Remove dead daemons' segments and stale sockets; the paths removed (or that would be)."""
    removed = []
    for name in stale_segments(directory):
        path = os.path.join(directory, name)
        sock = Ring.read_socket_path(path)
        if sock is not None and _stale_socket(sock):
            if not dry_run:
                segments.unlink(sock)
            removed.append(sock)
        if dry_run or segments.unlink(path):
            removed.append(path)
    return removed
