"""The shared-memory toolbox: folder, names, free space, creation, locks, liveness, sockets.

Every coordl segment (a MinIO cache, a coordinator's ring) is one file in a
shared-memory folder (`SHM_DIR`: ``/dev/shm``, a tmpfs) that processes map with
``MAP_SHARED``. This module is the one place that knows files and processes:
`create` (exclusive, allocated up front or left sparse, the out-of-space message),
`list_names` (by prefix), `free_bytes`, `alive` (pid plus start time),
`owner_uid`/`others` (segments of other users, which coordl never touches)
and `socket_state` (is anybody accepting on a Unix socket). It knows nothing
of what is inside a file (that is `cache.layout` and `coordl.coordinator.ring`).

Cache names: ``coordl-cache-<fingerprint[:16]>`` for the segment; a segment
being built is ``coordl-cache-<fingerprint[:16]>.tmp-<pid>-<start>`` until it
is published by ``link()`` under its final name, so nobody ever maps a
half-built segment, and a dead builder's file is told from a living one by
pid and start time (a reused pid does not keep it).

Locks are Linux open-file-description (OFD) byte-range locks on the segment
file itself. The kernel drops them when the last descriptor of the open file
description is closed, which includes the death of the process by SIGKILL, so
a lock can never be left held by a dead process:

- byte 0, exclusive: the writers' lock (inserts, pid table);
- byte 1, shared: held by every attached process for as long as it is
  attached; ``cleanup`` takes it exclusively (without waiting) to prove that
  nothing is attached.

The folder: ``SHM_DIR`` is ``$COORDL_SHM_DIR`` when that is set (read once, at
import), else ``/dev/shm``. Set it on a machine whose tmpfs is mounted
elsewhere, or to keep one job's segments apart from everybody else's (a
folder of its own on the tmpfs; the test suite runs in one per session). It
is every default: MinIO caches, coordinator rings (a daemon started as a
subprocess inherits it), ``coordl cache ls|drop``, ``coordl cleanup``
and ``coordl info``; processes that share a segment must agree on it (an
explicit ``directory=`` or ``--dir`` still wins).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import socket
import stat
import struct
from dataclasses import dataclass

from coordl.errors import CacheError, ConfigError, CoordlError

from .sizes import fmt_bytes  # the one byte formatter (also shm.fmt_bytes, as before)

#: The node's shared-memory folder: every coordl segment lives here unless told otherwise
#: ($COORDL_SHM_DIR, else /dev/shm; see the module docstring).
SHM_DIR = os.path.abspath(os.environ.get("COORDL_SHM_DIR") or "/dev/shm")
#: Every file coordl creates in a shared-memory folder starts with this.
COORDL_PREFIX = "coordl-"
PREFIX = COORDL_PREFIX + "cache-"
_TMP = ".tmp-"
_WRITER_BYTE, _ATTACH_BYTE = 0, 1


def segment_name(fingerprint: str, name: str | None = None) -> str:
    """The segment's file name: ``coordl-cache-<fingerprint[:16]>``, or ``coordl-cache-<name>``."""
    if name is None:
        return PREFIX + fingerprint[:16]
    if not name or "/" in name or name.startswith(".") or _TMP in name:
        raise ConfigError(f"name={name!r} is not a usable segment name: use letters, digits, '-' and '_'")
    return name if name.startswith(PREFIX) else PREFIX + name


# -- space and creation ------------------------------------------------------------------

def free_bytes(directory: str = SHM_DIR) -> int:
    """Bytes an unprivileged process may still allocate in `directory` (statvfs)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def check_free_space(directory: str, need: int, what: str, fix: str,
                     error: type[CoordlError] = CacheError) -> None:
    """Raise `error` naming `what`, the free space and `fix` when `need` bytes do not fit `directory`."""
    try:
        free = free_bytes(directory)
    except OSError as e:
        raise error(f"shared-memory folder {directory!r} is not usable ({e.strerror}): pass an "
                    "existing folder on a tmpfs, e.g. '/dev/shm'") from None
    if need > free:
        raise error(f"{what} does not fit {directory} ({fmt_bytes(free)} free): {fix}, free space in "
                    f"{directory}, or mount a larger {directory} (docker: --shm-size)")


def create(path: str, size: int, what: str, fix: str, error: type[CoordlError] = CacheError,
           allocate: int | None = None) -> int:
    """A new file of `size` bytes, mode 0600, created exclusively (O_EXCL, no symlink followed).
    Returns its descriptor.

    The first `allocate` bytes (default: all of them) are allocated now (posix_fallocate: no
    SIGBUS when they are written through a mapping); the rest is a hole that takes no memory on a
    tmpfs until its owner allocates it (the MinIO cache does, item by item, see `cache.minio`).
    The free-space check is for the whole `size` all the same: a segment that could never fill
    is refused now, not when it is half full. `what` names the segment and its size for the
    out-of-space message ("the ring (64.0 MiB)"), `fix` says what the user passes instead ("pass
    fewer --slots"); `error` is the exception raised.
    """
    directory = os.path.dirname(path) or "."
    check_free_space(directory, size, what, fix, error)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may only remove bits, but say it anyway
        os.ftruncate(fd, size)
        now = size if allocate is None else min(allocate, size)
        if now > 0:
            os.posix_fallocate(fd, 0, now)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        if e.errno == errno.ENOSPC:
            check_free_space(directory, size, what, fix, error)  # names the sizes if space went meanwhile
            raise error(f"{what} does not fit {directory}: {fix}, or mount a larger {directory} "
                        "(docker: --shm-size)") from None
        raise error(f"cannot reserve {fmt_bytes(size)} in {path}: {e.strerror}") from None
    return fd


def tmp_name(name: str) -> str:
    """The name a segment is built under: ``<name>.tmp-<pid>-<start>`` of this process."""
    pid = os.getpid()
    return f"{name}{_TMP}{pid}-{proc_start(pid) or 0}"


def create_tmp(directory: str, name: str, size: int, what: str, fix: str,
               allocate: int | None = None) -> tuple[int, str]:
    """`create` under the segment's building name (see `tmp_name`): (fd, tmp path)."""
    path = os.path.join(directory, tmp_name(name))
    return create(path, size, what, fix, allocate=allocate), path


def unlink(path: str) -> bool:
    """Remove `path`; False when it was gone already."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def publish(tmp: str, path: str) -> bool:
    """Give the built segment its final name; False when another process published first."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


# -- locks -------------------------------------------------------------------------------

def _lock(fd: int, cmd: int, kind: int, byte: int) -> None:
    fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", kind, os.SEEK_SET, byte, 1, 0))


def lock_writer(fd: int) -> None:
    """Wait for the writers' lock (exclusive)."""
    _lock(fd, fcntl.F_OFD_SETLKW, fcntl.F_WRLCK, _WRITER_BYTE)


def unlock_writer(fd: int) -> None:
    _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, _WRITER_BYTE)


def hold_attached(fd: int) -> None:
    """Mark this open file as attached until it is closed (shared lock on byte 1)."""
    _lock(fd, fcntl.F_OFD_SETLKW, fcntl.F_RDLCK, _ATTACH_BYTE)


def nobody_attached(fd: int) -> bool:
    """Take byte 1 exclusively without waiting: True (and held until `fd` closes) when nobody is attached."""
    try:
        _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, _ATTACH_BYTE)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def reopen(fd: int) -> int:
    """A new open file description of the same file (after fork: locks of our own, not the parent's)."""
    new = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
    os.close(fd)
    return new


# -- processes ---------------------------------------------------------------------------

def proc_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return None
    fields = stat_line[stat_line.rindex(b")") + 2:].split()
    return int(fields[19]) if fields[0] != b"Z" else None  # field 22 of proc(5); zombies are dead


def alive(pid: int, start: int) -> bool:
    """Is `pid` the same living process that had start time `start` (not a reused pid)?"""
    return pid > 0 and proc_start(pid) == start


# -- listing and owners ------------------------------------------------------------------

@dataclass(frozen=True)
class Removed:
    """One thing a cleaner removed (`coordl cleanup` prints it and counts it by kind and folder)."""
    kind: str   # what it was: "cache segment", "half-built cache segment", "coordinator segment", ...
    path: str   # where it was


def list_names(directory: str = SHM_DIR, prefix: str = PREFIX, building: bool = False) -> list[str]:
    """Names in `directory` that start with `prefix`, sorted; those still being built
    (``.tmp-``) only with ``building=True``, and then only those."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if n.startswith(prefix) and (_TMP in n) == building)


def stale_tmp_files(directory: str = SHM_DIR) -> list[str]:
    """This user's half-built cache segments whose builder is dead (killed while creating)."""
    out = []
    for n in list_names(directory, PREFIX, building=True):
        pid, _, start = n.rsplit(_TMP, 1)[1].partition("-")
        if not (pid.isdigit() and start.isdigit() and alive(int(pid), int(start))) and _mine(directory, n):
            out.append(n)
    return out


def owner_uid(path: str) -> int | None:
    """The uid that owns `path` (None: it is gone)."""
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return None


def _mine(directory: str, name: str) -> bool:
    return owner_uid(os.path.join(directory, name)) == os.getuid()


def user_name(uid: int) -> str:
    """'alice (uid 1001)', or 'uid 1001' for a uid without a passwd entry."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def others(directory: str = SHM_DIR, prefix: str = COORDL_PREFIX) -> list[tuple[str, int]]:
    """(name, uid) of the coordl files in `directory` that another user owns: coordl lists them
    and never touches them (they are theirs to drop, or root's)."""
    out = []
    for name in list_names(directory, prefix) + list_names(directory, prefix, building=True):
        uid = owner_uid(os.path.join(directory, name))
        if uid is not None and uid != os.getuid():
            out.append((name, uid))
    return sorted(out)


# -- sockets -----------------------------------------------------------------------------

ABSENT, NOT_SOCKET, LIVE, STALE = "absent", "not a socket", "live", "stale"


def socket_state(path: str, timeout: float = 1.0) -> str:
    """Is anybody accepting on the Unix socket `path`? ABSENT (no file), NOT_SOCKET (a file of
    another kind), LIVE (a connect succeeded) or STALE (a socket file nobody accepts on: its
    process is gone). Raises OSError when it cannot tell (no permission, a timeout)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ABSENT
    if not stat.S_ISSOCK(st.st_mode):
        return NOT_SOCKET
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(timeout)
        probe.connect(path)
        return LIVE
    except OSError as e:
        if e.errno == errno.ECONNREFUSED:
            return STALE
        if e.errno == errno.ENOENT:
            return ABSENT
        raise
    finally:
        probe.close()
