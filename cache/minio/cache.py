"""The MinIO static cache: a node-wide shared-memory cache of items' encoded bytes.

Admission is "first touch until full": an item is stored the first time any
process offers it, if it still fits; nothing is ever evicted or replaced. So
every epoch after the first serves exactly ``cached bytes / dataset bytes`` of
its bytes from memory, where the page cache (an LRU) thrashes under random
order. `get` returns a zero-copy memoryview into the shared arena.

NOTE [lifecycle of a cache segment]
- Who creates: the first process that opens the cache for a dataset
  fingerprint (`MinIOCache.open`, done by `coordl.DataLoader(cache=...)` in the
  training process). It checks that the whole segment would fit (statvfs),
  builds the file under a temporary name with its header and index allocated
  and the arena left a hole (no memory taken: see NOTE [capacity]), writes the
  header, and publishes it with link(): a racing creator loses the link,
  deletes its copy and attaches to the winner's.
- Who attaches: every other process opening the same fingerprint (other jobs,
  restarted jobs, spawned workers via __setstate__). Forked workers inherit
  the mapping; on first use they reopen the file (own lock state, see
  `cache.shm`) and register themselves. Attached processes hold a shared lock
  on byte 1 and a slot in the header's pid table. An opener that asks for
  another capacity than the segment's replaces it (unlinks it under the
  writers' lock and creates its own) when the pid table lists no living
  process, and is refused otherwise (NOTE [capacity]).
- Who writes: any attached process, one at a time, under the writers' lock.
  SIGKILL while holding it: the kernel releases the lock; the entry being
  written was reserved but never published, so no reader can see it, and
  the next writer takes its space back (`cache.layout`'s NOTE).
- Who unlinks: `drop()` / `coordl cache drop`, `coordl cleanup` for a segment
  whose creator is dead and to which no process is attached, and an opener
  of another capacity for a segment no living process is registered in.
  `close()` and process exit only detach. A dropped segment stays mapped (and
  correct) in processes still attached to it until they close; new openers
  build a new one.
- After SIGKILL of any process: its locks are released by the kernel, its pid
  slot is recognised as dead (pid plus start time) and reused; the segment
  stays until dropped or cleaned up.
- Superseded: a segment whose dataset (same label, the root folder) has a
  newer segment in the folder is stale (`coordl cache ls` says so);
  `coordl cleanup` removes it once nothing is attached.

NOTE [capacity: only what the dataset can use, memory as it fills]
- The capacity is capped to the dataset's bytes (``open(dataset_bytes=)``,
  which ``coordl.DataLoader`` and ``coordl serve`` pass from the manifest): a
  64 GiB request over a 60 MB dataset makes a 60 MB arena. Items are packed
  with no padding, so that is enough for every item (a writer killed
  mid-insert leaks nothing: the next writer takes its reservation back).
- Only the header and index are allocated at creation. The arena is a hole
  in the file (a tmpfs takes no page for it); `put` allocates the item's
  range (posix_fallocate) under the writers' lock before it reserves and
  writes it, so memory grows with what is cached, and a tmpfs that others
  have filled meanwhile refuses the put (the item stays a miss, read from
  storage; one `CacheFullWarning` per process) where a write into an
  unallocated page would SIGBUS the process.
- Sizes are compared after the cap. An opener whose capacity differs from
  the existing segment's: when no living process is registered in it, the
  opener unlinks it (the writers' lock held, so a concurrent opener waits
  and then finds the name gone) and creates one of its own size (what was
  cached is lost: it is a new cache); when one is, the opener gets a
  `CacheError` naming both sizes, the processes and the fix. Registration
  checks under the same lock that the segment is still the published one,
  so no process registers into a segment that was just replaced.

NOTE [checksums]
Every entry carries the xxh3-64 of its bytes (`cache.checksum`), stored by
`put` and verified by every `get` (see `cache.layout` for why this also makes
the lock-free read correct on weakly ordered CPUs). An entry that still does
not match under the writers' lock (bad memory, a stray write into the
mapping) is marked CORRUPT and counted in the header, so the count is
node-wide and each bad entry counts once (`stats()["cache_corrupt"]`, which
`coordl.DataLoader.stats()` reports). `get` returns None for it: the loader
reads the item from storage, and the `put` that follows is refused, so the
item stays a miss served from storage for the segment's lifetime rather
than being re-admitted into memory that just proved untrustworthy (and
without an entry that changes under a lock-free reader). Drop the cache to
start afresh.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import warnings
from collections.abc import Iterator

from coordl.errors import CacheError, ConfigError

from .. import shm
from ..checksum import digest
from ..forkguard import ForkGuard
from ..sizes import parse_size
from .layout import CORRUPT, Segment, data_offset, file_size

_OPEN_TRIES = 5


class CacheFullWarning(UserWarning):
    """The shared-memory folder has no room left for an item the cache would admit."""


class MinIOCache:
    """A node-wide cache of encoded item bytes for one dataset fingerprint.

    Args:
        capacity: bytes, or a size string ('8GiB'), of item data the cache may hold,
            at most the dataset's bytes (see `open`); its shared-memory segment is this
            plus a 24-byte-per-item index, and takes memory only as items are cached.
        directory: the shared-memory folder that holds the segment.
        name: segment name (default ``coordl-cache-<fingerprint[:16]>``, which
            is how every process on the node finds the same cache).

    Nothing is allocated until `open` (done by ``coordl.DataLoader``). If the
    segment exists already with the same capacity (after the cap), `open`
    attaches to it; with another one, it makes a new cache when no process
    uses the old one and raises `CacheError` when one does (NOTE [capacity]).
    ``coordl.MinIOCache`` is this class; `drop()` removes the cache from the node,
    otherwise it outlives the loader and the next process that opens the same
    dataset attaches to it and hits at once.
    """

    def __init__(self, capacity: int | str, *, directory: str = shm.SHM_DIR, name: str | None = None) -> None:
        capacity = parse_size(capacity, "capacity")
        self.capacity, self.directory, self._name = capacity, os.fspath(directory), name
        self.requested = capacity  # what was asked for; `capacity` is what it is once open
        self.fingerprint: str | None = None
        self._n = 0
        self._label = ""
        self._seg: Segment | None = None
        self._fork = ForkGuard()  # a forked child re-opens its file and registers (`_after_fork`)
        self._tlock = threading.Lock()
        self._warned = False  # CacheFullWarning given (once per process)

    # -- opening --
    @property
    def name(self) -> str | None:
        """The segment's file name in `directory` (None until `open` gives the fingerprint)."""
        return None if self.fingerprint is None else shm.segment_name(self.fingerprint, self._name)

    @property
    def path(self) -> str | None:
        """The segment's path, `directory`/`name` (None until `open`)."""
        return None if self.name is None else os.path.join(self.directory, self.name)

    @property
    def _fp(self) -> str:
        """The fingerprint, once `open` was called (the private steps of opening need it)."""
        if self.fingerprint is None:
            raise CacheError("this MinIOCache is not open: call open(fingerprint, n_items) first")
        return self.fingerprint

    @property
    def _named(self) -> str:
        return shm.segment_name(self._fp, self._name)

    @property
    def _where(self) -> str:
        return os.path.join(self.directory, self._named)

    @property
    def is_open(self) -> bool:
        """Whether `open` attached this process to the segment."""
        return self._seg is not None

    def open(self, fingerprint: str, n_items: int, label: str = "",
             dataset_bytes: int | None = None) -> MinIOCache:
        """Attach to the cache of this dataset on this node, creating it if there is none.

        `dataset_bytes` (the sum of the items' sizes) caps the capacity: a cache never holds
        more than the dataset. A segment of another capacity is replaced when no process uses
        it, else `CacheError` (NOTE [capacity]).
        """
        if self.fingerprint is not None and self.fingerprint != fingerprint:
            raise ConfigError(f"this MinIOCache already serves dataset {self.fingerprint[:16]}; "
                              "make one MinIOCache per dataset")
        if self._seg is not None:
            return self
        self.fingerprint, self._n, self._label = fingerprint, int(n_items), label
        if dataset_bytes is not None:
            self.capacity = max(min(self.requested, int(dataset_bytes)), 1)
        for _ in range(_OPEN_TRIES):
            seg = self._attach() or self._create()
            if seg is None:
                continue
            if self._join(seg):
                self._seg = seg
                self._fork.reset()
                return self
            seg.close()  # replaced or dropped between opening and registering: open again
        raise CacheError(f"cannot open cache segment {self.path}: it is being created and removed "
                         "concurrently (or other processes keep asking for other sizes); retry, "
                         "or drop it with `coordl cache drop`")

    def _join(self, seg: Segment) -> bool:
        """Register in `seg` if it is still the published segment (under the writers' lock)."""
        shm.lock_writer(seg.fd)
        try:
            if not self._published(seg):
                return False
            seg.register(os.getpid(), shm.proc_start(os.getpid()) or 0)
            return True
        finally:
            shm.unlock_writer(seg.fd)

    def _published(self, seg: Segment) -> bool:
        """Is `seg` the file under the segment's name now (not unlinked, not replaced)?"""
        try:
            named, mine = os.stat(self._where), os.fstat(seg.fd)
        except FileNotFoundError:
            return False
        return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)

    def _attach(self) -> Segment | None:
        try:
            fd = os.open(self._where, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            shm.hold_attached(fd)
            if os.fstat(fd).st_nlink == 0:  # dropped or cleaned up while we opened it
                os.close(fd)
                return None
            seg = Segment(fd, self._where)
        except BaseException:
            os.close(fd)
            raise
        theirs, n = seg.fingerprint, seg.n_items
        if theirs != self.fingerprint or n != self._n:
            seg.close()
            raise CacheError(
                f"cache segment {self._where} holds dataset {theirs[:16]} ({n} items), "
                f"not {self._fp[:16]} ({self._n} items): pass another name=, or drop it "
                f"(coordl cache drop {self._named})")
        if seg.capacity != self.capacity:
            return self._replace(seg)
        return seg

    def _replace(self, seg: Segment) -> None:
        """`seg` has another capacity: unlink it when no living process is registered in it (the
        caller then creates one of ours), else refuse with both sizes and the fix."""
        theirs = seg.capacity
        shm.lock_writer(seg.fd)
        try:
            users = seg.attached()
            if not users and self._published(seg):
                os.unlink(self._where)
        finally:
            shm.unlock_writer(seg.fd)
            seg.close()
        if users:
            raise CacheError(self._size_conflict(theirs, users))
        return None

    def _size_conflict(self, theirs: int, users: list[int]) -> str:
        asked = f"{shm.fmt_bytes(self.capacity)} ({self.capacity} bytes"
        if self.capacity != self.requested:
            asked += f", {shm.fmt_bytes(self.requested)} capped to the dataset's bytes"
        return (f"cache segment {self._where} of dataset {self._fp[:16]} has capacity "
                f"{shm.fmt_bytes(theirs)} ({theirs} bytes) and is in use by process(es) "
                f"{', '.join(map(str, users))}; this cache asks for {asked}): pass {theirs} as "
                f"the cache size to share it (cache={theirs}, or coordl serve --cache {theirs}), "
                "or stop those processes first and the next open makes a cache of the new size")

    def _create(self) -> Segment | None:
        size = file_size(self._n, self.capacity)
        fd, tmp = shm.create_tmp(
            self.directory, self._named, size,
            f"cache capacity {shm.fmt_bytes(self.capacity)} (segment {shm.fmt_bytes(size)} with its index)",
            f"pass a smaller cache (e.g. cache='{self._fitting_mib(size)}MiB')",
            allocate=data_offset(self._n))  # the arena: as it fills (NOTE [capacity])
        try:
            seg = Segment.create(fd, tmp, self.capacity, self._n, self._fp, self._label)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        try:
            shm.hold_attached(fd)
        except BaseException:
            seg.close()
            os.unlink(tmp)
            raise
        if not shm.publish(tmp, self._where):
            seg.close()
            return None  # another process published first: attach to it
        seg.path = self._where
        return seg

    def _fitting_mib(self, size: int) -> int:
        """The capacity that would fit the folder now, in MiB (the hint in the out-of-space message)."""
        try:
            return max(shm.free_bytes(self.directory) - (size - self.capacity), 0) // 2**20
        except OSError:
            return 0

    def _register(self) -> None:
        with self._writer() as seg:
            seg.register(os.getpid(), shm.proc_start(os.getpid()) or 0)

    def _segment(self) -> Segment:
        seg = self._seg
        if seg is None:
            if self.fingerprint is not None:
                raise CacheError(f"the MinIOCache of {self.path} was closed or dropped: make a new "
                                 "loader with cache=... to attach to (or create) the dataset's cache")
            raise CacheError("the MinIOCache is not open: pass it to coordl.DataLoader(cache=...) "
                             "or call cache.open(fingerprint, n_items)")
        if self._fork.forked():
            self._after_fork(seg)
        return seg

    def _after_fork(self, seg: Segment) -> None:
        """In a forked child: own open file (own locks), own thread lock, own pid slot."""
        self._tlock = threading.Lock()
        self._fork.reset()
        seg.fd = shm.reopen(seg.fd)
        shm.hold_attached(seg.fd)
        self._register()

    # -- the two operations --
    def get(self, i: int) -> memoryview | None:
        """Item i's bytes (a zero-copy view into shared memory), or None when not cached."""
        seg = self._segment()
        if not 0 <= i < self._n:
            raise IndexError(f"item {i} is out of range for a cache of {self._n} items")
        n = int(seg.lengths[i])  # length first, then offset and checksum (cache.layout NOTE)
        if n <= 0:
            return None
        off, want = int(seg.offsets[i]), int(seg.checksums[i])
        view = seg.arena[off:off + n]
        return view if digest(view) == want else self._verify_locked(i)

    def _verify_locked(self, i: int) -> memoryview | None:
        """The hash did not match: read the entry again under the writers' lock (which also orders
        memory on CPUs that reorder stores); serve it if it matches now, else mark it CORRUPT."""
        with self._writer() as seg:
            n = int(seg.lengths[i])
            if n <= 0:
                return None  # marked by another process meanwhile: counted once, by it
            off = int(seg.offsets[i])
            view = seg.arena[off:off + n]
            if digest(view) == int(seg.checksums[i]):
                return view
            seg.lengths[i] = CORRUPT
            seg.head["corrupt"] += 1
            return None

    def put(self, i: int, raw: bytes | memoryview) -> bool:
        """Offer item i's bytes; True when they were admitted (first touch, if they fit)."""
        seg = self._segment()
        if not 0 <= i < self._n:
            raise IndexError(f"item {i} is out of range for a cache of {self._n} items")
        n = memoryview(raw).nbytes
        if n == 0 or seg.lengths[i] != 0 or seg.used + n > seg.capacity:  # `used` only grows
            return False  # (lengths[i] == CORRUPT: never admitted again, see NOTE [checksums])
        checksum = digest(raw)
        with self._writer() as seg:
            off = seg.used
            if seg.lengths[i] != 0 or off + n > seg.capacity or not self._allocate(seg, off, n):
                return False
            seg.head["pending_used"] = off  # 0. say what is being inserted (layout NOTE): a writer
            seg.head["pending_item"] = i + 1  # killed from here on is undone by the next one
            seg.head["used"] = off + n     # 1. reserve
            self._write(seg, off, raw)     # 2. copy the bytes
            seg.offsets[i] = off           # 3. publish: offset, checksum, then length
            seg.checksums[i] = checksum
            seg.lengths[i] = n
            seg.head["pending_item"] = 0
        return True

    @staticmethod
    def _undo_dead_writer(seg: Segment) -> None:
        """Under the writers' lock: a set `pending_item` means the last holder died mid-insert
        (the kernel released its lock). Its reservation is taken back unless it had published
        the entry (the length is stored last, so a published entry is complete)."""
        pending = int(seg.head["pending_item"][0])
        if pending:
            if seg.lengths[pending - 1] == 0:
                seg.head["used"] = seg.head["pending_used"][0]
            seg.head["pending_item"] = 0

    def _allocate(self, seg: Segment, off: int, n: int) -> bool:
        """Allocate the arena's pages for [off, off + n) (NOTE [capacity]); False when the folder
        is full (warned once per process), so the item is not admitted instead of a SIGBUS."""
        try:
            os.posix_fallocate(seg.fd, seg.data_offset + off, n)
            return True
        except OSError as e:
            if not self._warned:
                self._warned = True
                why = "is full" if e.errno in (errno.ENOSPC, errno.EFBIG) else f"refused ({e.strerror})"
                warnings.warn(
                    f"cache segment {self.path}: {self.directory} {why} after "
                    f"{shm.fmt_bytes(seg.used)} of {shm.fmt_bytes(seg.capacity)} were cached; items "
                    "beyond are read from storage: free space there, or make the cache smaller",
                    CacheFullWarning, stacklevel=4)
            return False

    def _write(self, seg: Segment, off: int, raw) -> None:
        seg.arena[off:off + memoryview(raw).nbytes] = memoryview(raw).cast("B")

    @contextlib.contextmanager
    def _writer(self) -> Iterator[Segment]:
        """The writers' lock: a thread lock, then the cross-process OFD lock on byte 0."""
        seg = self._segment()
        with self._tlock:
            shm.lock_writer(seg.fd)
            try:
                self._undo_dead_writer(seg)
                yield seg
            finally:
                shm.unlock_writer(seg.fd)

    # -- state --
    def stats(self) -> dict[str, int]:
        """cache_bytes (encoded bytes of cached items, no padding), cache_items, cache_capacity,
        cache_corrupt (entries whose checksum did not match, node-wide, each counted once)."""
        seg = self._segment()
        return {"cache_bytes": seg.cached_bytes(), "cache_items": seg.cached_items(),
                "cache_capacity": seg.capacity, "cache_corrupt": seg.corrupt_items()}

    def close(self) -> None:
        """Detach this process (the segment stays for the next job; `drop` removes it)."""
        seg = self._seg
        if seg is None:
            return
        if self._fork.owner():
            with self._writer():
                seg.unregister(os.getpid())
        self._seg = None
        seg.close()

    def drop(self) -> None:
        """Remove the segment from the node (processes still attached keep their mapping)."""
        path = self.path
        self.close()
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __getstate__(self) -> dict:
        """Pickled into spawned workers by name: they re-attach, the arena is never copied."""
        return {"capacity": self.capacity, "directory": self.directory, "name": self._name,
                "fingerprint": self.fingerprint, "n": self._n, "label": self._label}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["capacity"], directory=state["directory"], name=state["name"])
        if state["fingerprint"] is not None:
            self.open(state["fingerprint"], state["n"], state["label"])

    def __repr__(self) -> str:
        where = self.path or f"{self.directory} (not open)"
        return f"MinIOCache(capacity={shm.fmt_bytes(self.capacity)}, segment={where})"
