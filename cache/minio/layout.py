"""The bytes inside a MinIO cache segment, as numpy views on the shared mapping.

    [0, 4096)                 header (HEADER below)
    [4096, data_offset)       index: offsets int64[n], lengths int64[n], checksums uint64[n]
    [data_offset, +capacity)  arena: item bytes, packed back to back, append-only

Item i is cached when ``lengths[i] > 0``; its bytes are
``arena[offsets[i] : offsets[i] + lengths[i]]`` and their xxh3-64 is
``checksums[i]`` (`cache.checksum`). ``lengths[i] == CORRUPT`` (-1) marks an
item whose bytes were found not to match their checksum: it is never served
and never admitted again (a miss, read from storage, every time). The
header's ``used`` is the end of the last reservation in the arena: it only
grows, except when a dead writer's unpublished reservation is taken back
(below). Nothing here is a Python object per item, so forked workers share
every page.

NOTE [publication without a reader lock, on any CPU]
Writers hold the writers' lock (see `cache.shm`) and publish in this order:
reserve (``used += n``), copy the bytes, store ``offsets[i]``, ``checksums[i]``,
then ``lengths[i]``. Readers take no lock: they load ``lengths[i]``, then
``offsets[i]`` and ``checksums[i]``, then hash the bytes. On x86-64 (total
store order) a reader that sees a non-zero length sees the complete entry.
On a weakly ordered CPU (aarch64, POWER) it may see the length before the
bytes, offset or checksum; the hash then does not match, and the reader
(`MinIOCache.get`) takes the writers' lock and reads the entry again. The
lock is the barrier: the kernel's lock hand-over (a spinlock release in the
writer's unlock, an acquire in the reader's lock) makes every store the
writer made before unlocking visible to the reader after locking. So a
reader serves bytes only once they hash to what the writer stored, and marks
an entry CORRUPT only when it still does not match under the lock. The cost
on x86-64 is the hash (~10 us for a 100 KiB JPEG); the lock is taken only on
a mismatch. How it was checked: there is no aarch64 machine here, so
tests/cache/minio/test_minio.py makes that reordering happen on purpose (a writer
publishes offset, checksum and length before the bytes, holding the lock)
and shows that a reader meanwhile waits on the lock and serves the complete
entry, with nothing counted as corrupt. The header needs no more: its
creator writes it before taking the attach lock and publishing the name, and
every attacher takes the attach lock (the same inode's lock list, so the
same kernel lock hand-over) before it reads the header.
A writer killed between reserve and publish leaves its reservation unpublished;
nothing can read it, and the next writer takes the space back: before it
reserves, a writer records ``pending_item`` (1 + i) and ``pending_used`` (the
``used`` it found), and clears ``pending_item`` after it published. A writer
that takes the lock and finds ``pending_item`` set knows its predecessor died
holding it (the kernel released the lock): if ``lengths[i]`` is 0 the entry was
never published and ``used`` goes back to ``pending_used``; if it is set, the
entry was complete (the length is stored last) and stays. Segments made before
these two fields existed read them as 0 (nothing pending).
"""

from __future__ import annotations

import mmap
import os
import time

import numpy as np

from coordl.errors import CacheError

from .. import shm

MAGIC = b"COORDLMC"
VERSION = 2
HEADER_BYTES = 4096
PID_SLOTS = 128  # attached processes listed by `coordl cache ls` (more still work, unlisted)

HEADER = np.dtype([
    ("magic", "S8"),
    ("version", "<i8"),
    ("capacity", "<i8"),       # arena bytes
    ("n_items", "<i8"),        # items in the dataset (index length)
    ("data_offset", "<i8"),    # where the arena starts in the file
    ("used", "<i8"),           # arena bytes reserved so far (only grows)
    ("creator_pid", "<i8"),
    ("creator_start", "<i8"),  # /proc start time of the creator (pid reuse guard)
    ("created_ns", "<i8"),     # time.time_ns() at creation
    ("fingerprint", "S64"),    # sha256 hex of the dataset manifest
    ("label", "S256"),         # what the dataset is, for humans (its root folder)
    ("pids", "<i8", (PID_SLOTS, 2)),  # (pid, start time) of attached processes; 0: free
    ("corrupt", "<i8"),        # items whose bytes did not match their checksum (under the lock)
    ("pending_item", "<i8"),   # 1 + the item a writer is inserting (0: none); see NOTE below
    ("pending_used", "<i8"),   # `used` before that writer's reservation
])
CORRUPT = -1  # lengths[i] of an item found corrupt: never served, never admitted again
INDEX_BYTES = 24  # per item: offset, length, checksum
assert HEADER.itemsize <= HEADER_BYTES


def data_offset(n_items: int) -> int:
    """The arena starts page-aligned after the index."""
    return HEADER_BYTES + -(-INDEX_BYTES * n_items // 4096) * 4096


def file_size(n_items: int, capacity: int) -> int:
    return data_offset(n_items) + capacity


_CLOSED = np.zeros(0, np.int64)  # what the views of a closed segment become


class Segment:
    """Views on one mapped segment file; `fd` is the process's open file (locks live on it)."""

    head: np.ndarray        # the header, one record of HEADER
    offsets: np.ndarray     # int64 per item: where its bytes start in the arena
    lengths: np.ndarray     # int64 per item: 0 until published
    checksums: np.ndarray   # uint64 per item
    arena: memoryview       # the item bytes (empty when mapped without them, or closed)

    def __init__(self, fd: int, path: str, writable: bool = True, whole: bool = True) -> None:
        self.fd, self.path = -1, path  # owns `fd` only once it is constructed
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES:
            raise CacheError(f"{path} is not a coordl cache segment ({size} bytes): remove it "
                             f"(coordl cache drop {os.path.basename(path)})")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        head = np.frombuffer(mmap.mmap(fd, HEADER_BYTES, access=access), HEADER, 1)
        end = int(head["data_offset"][0]) + int(head["capacity"][0]) if head["magic"][0] == MAGIC else 0
        if head["magic"][0] != MAGIC or head["version"][0] != VERSION or size != end:
            raise CacheError(f"{path} is not a coordl cache segment of version {VERSION} (or it is "
                             f"truncated): remove it (coordl cache drop {os.path.basename(path)})")
        self.map = mmap.mmap(fd, size if whole else int(head["data_offset"][0]), access=access)
        self.head = np.frombuffer(self.map, HEADER, 1)
        n = self.n_items
        index = np.frombuffer(self.map, np.int64, 2 * n, offset=HEADER_BYTES)
        self.offsets, self.lengths = index[:n], index[n:]
        self.checksums = np.frombuffer(self.map, np.uint64, n, offset=HEADER_BYTES + 16 * n)
        self.arena = memoryview(self.map)[self.data_offset:] if whole else memoryview(b"")
        self.fd = fd

    def field(self, key: str):
        return self.head[key][0]

    @property
    def n_items(self) -> int:
        return int(self.field("n_items"))

    @property
    def capacity(self) -> int:
        return int(self.field("capacity"))

    @property
    def data_offset(self) -> int:
        return int(self.field("data_offset"))

    @property
    def used(self) -> int:
        return int(self.field("used"))

    @property
    def fingerprint(self) -> str:
        return self.field("fingerprint").decode()

    @classmethod
    def create(cls, fd: int, path: str, capacity: int, n_items: int, fingerprint: str,
               label: str) -> Segment:
        """Write the header of a fresh, zero-filled file (nobody else sees it yet) and map it."""
        head = np.frombuffer(mmap.mmap(fd, HEADER_BYTES), HEADER, 1)
        start = shm.proc_start(os.getpid()) or 0
        for key, value in (("version", VERSION), ("capacity", capacity), ("n_items", n_items),
                           ("data_offset", data_offset(n_items)), ("used", 0),
                           ("creator_pid", os.getpid()), ("creator_start", start),
                           ("created_ns", time.time_ns()), ("fingerprint", fingerprint.encode()),
                           ("label", label.encode("utf-8", "replace")[:256])):
            head[key] = value
        head["magic"] = MAGIC  # last: a segment without magic is refused
        return cls(fd, path)

    # -- stats, lock-free (exact for published entries) --
    def cached_bytes(self) -> int:
        return int(self.lengths[self.lengths > 0].sum())

    def cached_items(self) -> int:
        return int(np.count_nonzero(self.lengths > 0))

    def corrupt_items(self) -> int:
        return int(self.field("corrupt"))

    # -- attached processes; call with the writers' lock held --
    def register(self, pid: int, start: int) -> None:
        table = self.head["pids"][0]
        for slot in table:
            if slot[0] == 0 or not shm.alive(int(slot[0]), int(slot[1])):
                slot[1], slot[0] = start, pid
                return

    def unregister(self, pid: int) -> None:
        table = self.head["pids"][0]
        table[table[:, 0] == pid] = 0

    def attached(self) -> list[int]:
        """Living processes in the pid table."""
        return [int(p) for p, s in self.head["pids"][0] if p and shm.alive(int(p), int(s))]

    def creator_alive(self) -> bool:
        return shm.alive(int(self.field("creator_pid")), int(self.field("creator_start")))

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)

    def close(self) -> None:
        """Unmap (unless the caller still holds views of item bytes: then when they go) and close fd."""
        self.head = self.offsets = self.lengths = self.checksums = _CLOSED
        for buf in (self.arena, self.map):
            try:
                buf.release() if isinstance(buf, memoryview) else buf.close()
            except BufferError:
                pass  # item views handed out by get() are alive: the mapping goes with the last one
        self.arena = memoryview(b"")
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

