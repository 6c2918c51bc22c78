"""Segment files of the MinIO cache: names, free space, creation, locks, liveness.

A cache segment is one file in a shared-memory folder (``/dev/shm``, a tmpfs)
that every process maps with ``MAP_SHARED``. This module knows files and
processes, not the layout inside the file (that is `cache.layout`).

Names: ``coordl-cache-<fingerprint[:16]>`` for the segment; a segment being
built is ``coordl-cache-<fingerprint[:16]>.tmp-<pid>`` until it is published
by ``link()`` under its final name, so nobody ever maps a half-built segment.

Locks are Linux open-file-description (OFD) byte-range locks on the segment
file itself. The kernel drops them when the last descriptor of the open file
description is closed, which includes the death of the process by SIGKILL, so
a lock can never be left held by a dead process:

- byte 0, exclusive: the writers' lock (inserts, pid table);
- byte 1, shared: held by every attached process for as long as it is
  attached; ``cleanup`` takes it exclusively (without waiting) to prove that
  nothing is attached.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from coordl.errors import CacheError, ConfigError

PREFIX = "coordl-cache-"
DEFAULT_DIR = "/dev/shm"
_TMP = ".tmp-"
_WRITER_BYTE, _ATTACH_BYTE = 0, 1


def segment_name(fingerprint: str, name: str | None = None) -> str:
    """The segment's file name: ``coordl-cache-<fingerprint[:16]>``, or ``coordl-cache-<name>``."""
    if name is None:
        return PREFIX + fingerprint[:16]
    if not name or "/" in name or name.startswith(".") or _TMP in name:
        raise ConfigError(f"name={name!r} is not a usable segment name: use letters, digits, '-' and '_'")
    return name if name.startswith(PREFIX) else PREFIX + name


def fmt_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def check_free_space(directory: str, need: int, capacity: int) -> None:
    """Raise CacheError, naming both sizes and the fix, when `need` bytes do not fit `directory`."""
    try:
        free = free_bytes(directory)
    except OSError as e:
        raise CacheError(f"cache directory {directory!r} is not usable ({e.strerror}): pass an "
                         "existing folder on a tmpfs, e.g. directory='/dev/shm'") from None
    if need > free:
        raise CacheError(
            f"cache capacity {fmt_bytes(capacity)} (segment {fmt_bytes(need)} with its index) does not "
            f"fit {directory} ({fmt_bytes(free)} free): pass a smaller cache (e.g. cache="
            f"'{max(free - (need - capacity), 0) // 2**20}MiB'), free space in {directory}, or mount a "
            f"larger {directory} (docker: --shm-size)")


def create_tmp(directory: str, name: str, size: int, capacity: int) -> tuple[int, str]:
    """A new file of `size` bytes, all of them allocated now (no SIGBUS later): (fd, tmp path)."""
    check_free_space(directory, size, capacity)
    path = os.path.join(directory, f"{name}{_TMP}{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        if e.errno == errno.ENOSPC:
            check_free_space(directory, size, capacity)  # names the sizes if space went meanwhile
            raise CacheError(f"cache capacity {fmt_bytes(capacity)} does not fit {directory}: pass a "
                             "smaller cache, or mount a larger one (docker: --shm-size)") from None
        raise CacheError(f"cannot reserve {fmt_bytes(size)} in {path}: {e.strerror}") from None
    return fd, path


def publish(tmp: str, path: str) -> bool:
    """Give the built segment its final name; False when another process published first."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


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


def proc_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[19]) if fields[0] != b"Z" else None  # field 22 of proc(5); zombies are dead


def alive(pid: int, start: int) -> bool:
    """Is `pid` the same living process that had start time `start` (not a reused pid)?"""
    return pid > 0 and proc_start(pid) == start


def list_names(directory: str) -> list[str]:
    """Published segment names in `directory`."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(PREFIX) and _TMP not in n)


def stale_tmp_files(directory: str) -> list[str]:
    """Half-built segments whose builder is dead (killed while creating)."""
    out = []
    for n in os.listdir(directory) if os.path.isdir(directory) else []:
        if n.startswith(PREFIX) and _TMP in n:
            pid = n.rsplit(_TMP, 1)[1]
            if not (pid.isdigit() and proc_start(int(pid)) is not None):
                out.append(n)
    return out
