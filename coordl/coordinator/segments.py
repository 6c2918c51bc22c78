"""Names and lifetime of the daemon's shared-memory segments.

A segment is a file in /dev/shm (a tmpfs) that processes map with
``MAP_SHARED``. Every name the daemon creates starts with its own prefix,

    coordl-serve-<pid>-<start>-

where <pid> is the daemon's process id and <start> its start time in clock
ticks since boot (proc(5) field 22), so that a pid reused by an unrelated
process never makes a dead daemon's segments look alive. `owner_alive(name)`
tells from the name alone whether the daemon that made a segment still runs
(pid and start time: coordl.cache.shm, the one shared-memory toolbox, which
also creates, lists and measures segments); cleanup.py removes those whose
owner is gone.

Lifetime: the daemon creates (mode 0600, O_EXCL) and is the only process that
unlinks; jobs and prep workers only map and close. An unlinked segment stays
readable through the mappings that exist until the last one is closed.
"""

from __future__ import annotations

import mmap
import os

from coordl.cache import shm
from coordl.cache.shm import SHM_DIR, alive, proc_start, unlink  # noqa: F401 (segments.unlink)
from coordl.errors import CoordinatorError

PREFIX = "coordl-serve-"


def daemon_prefix(pid: int | None = None) -> str:
    """The prefix of every segment the daemon `pid` (default: this process) creates."""
    pid = os.getpid() if pid is None else pid
    return f"{PREFIX}{pid}-{proc_start(pid)}-"


def owner(name: str) -> tuple[int, int] | None:
    """(pid, start) of the daemon that created segment `name`; None if `name` is not ours."""
    if not name.startswith(PREFIX):
        return None
    parts = name[len(PREFIX):].split("-", 2)
    if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def owner_alive(name: str) -> bool:
    who = owner(name)
    return who is not None and alive(*who)


def create(name: str, size: int, directory: str = SHM_DIR) -> tuple[int, str]:
    """A new segment of `size` bytes, mode 0600, every page reserved now (no SIGBUS later)."""
    path = os.path.join(directory, name)
    fd = shm.create(path, size, f"the ring ({shm.fmt_bytes(size)})",
                    "pass fewer --slots or a smaller --batch-size", CoordinatorError)
    return fd, path


def map_file(path: str, writable: bool) -> mmap.mmap:
    """Map the whole segment at `path` (read-only unless `writable`)."""
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, mmap.MAP_SHARED,
                         mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
    finally:
        os.close(fd)
