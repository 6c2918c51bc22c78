"""Batch buffers in shared memory that a worker reuses once the training process has let go.

A worker that allocates a fresh shared-memory buffer for every batch pays
for it three times: the kernel allocates and zeroes every page (torch's
`_new_shared` fallocates), the worker takes a page fault on each page as it
writes the first image into it, and the training process maps the buffer
anew and faults again when it reads it. For 224x224 images that is ~0.17 ms
an image, ~9% of coordl's whole per-image cost (bench/results/steps-photo.md).

So each worker keeps a few buffers (`WorkerBuffers`, made in the worker) and
writes a batch into one the training process no longer uses. Who may touch a
buffer is one byte in its own trailer, after the pixels:

    FREE -> LENT     the worker, when it starts writing a batch into the buffer
    LENT -> FREE     the training process, once no tensor there refers to the
                     batch any more (the storage's use count is 1: only the
                     `Lender`'s own handle)
    any  -> RETIRED  the worker, when it drops the buffer for a bigger one

The training process learns of a batch when it *unpickles* it (`arrived`,
called by coordl's `Batch`), whatever iterator or loader class received it:
coordl's own, torch's, or the one Accelerate's `prepare()` builds. The
process-wide `LENDER` keeps one handle per buffer, so that the buffer stays
mapped (torch's shared-storage cache maps the next batch in it to the same
memory), and on each arrival frees the buffers nothing refers to. The
trailer also holds the worker's pid: the handles of a worker that is gone
are dropped when a new worker shows up (`sweep`), or when coordl's own
iterator shuts its workers down.

Each side writes only its own transition, so no lock is needed on x86-64,
whose total store order keeps the training process's last reads of a batch
before its FREE store. A weakly ordered CPU (aarch64, POWER) may let the worker
see FREE and overwrite the buffer before those reads are done, and nothing
here orders them, so `WorkerBuffers` refuses to run there (`check_platform`:
pass ``reuse_buffers=False``). The MinIO cache has no such limit: its readers
verify a checksum and take the lock on a mismatch (cache/minio/layout.py NOTE). A batch the
user keeps (a list of batches, gradient accumulation) keeps its buffer LENT;
the worker then allocates a fresh buffer, as torch does, and counts it in
`stats()["batch_buffers"]`. The buffers are torch's anonymous shared memory
(file-descriptor strategy: no name in /dev/shm): a worker's die with it, the
training process's with the last handle.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import threading

import numpy as np
import torch

from .cache import shm
from .cache.forkguard import ForkGuard
from .errors import ConfigError

FREE, LENT, RETIRED = 0, 1, 2
#: Buffers per worker beyond prefetch_factor: the batch being written, the one
#: the training step holds, the one it just dropped (seen at the next arrival).
EXTRA_SLOTS = 3


def use_count(storage: torch.UntypedStorage) -> int:
    """How many handles (tensors, storage objects) share this storage's memory in this process."""
    return torch._C._storage_Use_Count(storage._cdata)


def new_shared(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_shared(nbytes)


#: Anonymous memory of at least this size is asked for in 2 MiB pages (`new_private`).
HUGE_PAGE = 2 << 20


def new_private(nbytes: int) -> torch.UntypedStorage:
    """Private memory for a buffer that is reused batch after batch, in 2 MiB pages where it can be.

    A buffer of a batch of 224x224 images is tens of MB: in 4 KiB pages its first fill takes a
    page fault per page (9,400 for a batch of 256), which on a loaded machine cost a job more
    CPU than all its copies (bench/sharing.py). So the buffer is an anonymous mapping with
    MADV_HUGEPAGE, as torch's own `THP_MEM_ALLOC_ENABLE=1` does for its CPU tensors: with
    transparent huge pages in "madvise" or "always" mode it is faulted in 2 MiB at a time
    (a few dozen faults); where THP is off it is ordinary memory. The storage keeps the
    mapping alive and unmaps it when the last tensor on it goes.
    """
    if nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
    mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mem.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without THP: 4 KiB pages, as torch.empty would give
        pass
    return torch.frombuffer(mem, dtype=torch.uint8).untyped_storage()


#: CPUs whose total store order makes the slot table's lock-free hand-over correct.
TSO_MACHINES = frozenset({"x86_64", "amd64"})


def check_platform(machine: str | None = None) -> None:
    """Raise ConfigError unless this CPU (`platform.machine()`) keeps stores in order (x86-64)."""
    machine = machine or platform.machine() or "an unknown CPU"
    if machine.lower() not in TSO_MACHINES:
        raise ConfigError(
            f"reuse_buffers=True (the default) hands batch buffers back between processes without a "
            f"lock, which is correct only on x86-64 (total store order); this machine is {machine}: "
            "pass coordl.DataLoader(..., reuse_buffers=False), which gives every batch a fresh "
            "buffer as torch does")


#: Bytes after a buffer's pixels: the flag (byte 0), a magic (1-7), the worker's pid (8-15).
TRAILER = 64
_MAGIC = b"coordlB"


def _trailer_at(storage: torch.UntypedStorage) -> int:
    return storage.data_ptr() + storage.nbytes() - TRAILER


class WorkerBuffers:
    """A worker's reusable batch buffers (process-local: made lazily in the worker process)."""

    def __init__(self, slots: int) -> None:
        check_platform()
        self.slots = slots
        self.fork = ForkGuard()  # the worker that made them; a forked copy makes its own
        self._buffers: list[torch.UntypedStorage] = []
        self._flags: list[np.ndarray] = []   # byte 0 of each buffer's trailer

    def _new(self, nbytes: int) -> tuple[torch.UntypedStorage, np.ndarray]:
        capacity = -(-nbytes // TRAILER) * TRAILER
        buf = new_shared(capacity + TRAILER)
        trailer = torch.empty(0, dtype=torch.uint8).set_(  # pyright: ignore[reportCallIssue] (storage, offset, size)
            buf, capacity, (TRAILER,)).numpy()
        trailer[1:8] = np.frombuffer(_MAGIC, dtype=np.uint8)
        trailer[8:16] = np.frombuffer(np.int64(self.fork.pid).tobytes(), dtype=np.uint8)
        return buf, trailer

    def acquire(self, nbytes: int) -> tuple[torch.UntypedStorage, bool, bool]:
        """(buffer of >= nbytes, whether it is one of this worker's reusable ones, whether it was
        newly allocated); a reusable one is marked LENT until the training process lets go."""
        for n, flags in enumerate(self._flags):
            if flags[0] != FREE:
                continue
            buf, fresh = self._buffers[n], False
            if buf.nbytes() - TRAILER < nbytes:
                flags[0] = RETIRED  # the training process drops its handle of the small one
                buf, flags = self._new(nbytes)
                self._buffers[n], self._flags[n], fresh = buf, flags, True
            flags[0] = LENT
            return buf, True, fresh
        if len(self._buffers) < self.slots:
            buf, flags = self._new(nbytes)
            flags[0] = LENT
            self._buffers.append(buf)
            self._flags.append(flags)
            return buf, True, True
        return new_shared(nbytes), False, True

    def give_back(self, buf: torch.UntypedStorage) -> None:
        """The batch written into `buf` is not sent after all (it raised)."""
        for n, mine in enumerate(self._buffers):
            if mine.data_ptr() == buf.data_ptr():
                self._flags[n][0] = FREE


class Lender:
    """Training-process side: one handle per worker buffer seen, freed once nothing uses it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # buffer address -> (the one storage handle this process keeps, its flag byte, worker pid)
        self._mapped: dict[int, tuple[torch.UntypedStorage, ctypes.c_uint8, int]] = {}
        self._lent: set[int] = set()
        # worker pid -> its start time when first seen (a pid the kernel reused is not that worker)
        self._pids: dict[int, int | None] = {}

    def __len__(self) -> int:
        return len(self._mapped)

    def arrived(self, images: torch.Tensor) -> None:
        """A batch written into a worker buffer reached this process (called as it is unpickled)."""
        storage = images.untyped_storage()
        if storage.nbytes() < TRAILER or not storage.is_shared():
            return
        at = _trailer_at(storage)
        if ctypes.string_at(at + 1, 7) != _MAGIC:
            return  # not a coordl worker buffer: leave it alone
        with self._lock:
            self._release_unused()
            key = storage.data_ptr()
            if key not in self._mapped:
                pid = int.from_bytes(ctypes.string_at(at + 8, 8), "little", signed=True)
                self._mapped[key] = (storage, ctypes.c_uint8.from_address(at), pid)
                if pid not in self._pids:
                    self._pids[pid] = shm.proc_start(pid)
                    self._sweep()
            del storage  # exactly one handle of ours, so that use_count == 1 means "unused"
            self._lent.add(key)

    def _release_unused(self) -> None:
        for key, (storage, flag, _pid) in list(self._mapped.items()):
            if use_count(storage) != 1:
                continue
            if flag.value == RETIRED:
                self._lent.discard(key)
                del self._mapped[key]
            elif key in self._lent:
                self._lent.discard(key)
                flag.value = FREE

    def _sweep(self) -> None:
        """Drop the handles of buffers whose worker is gone and that nothing here uses."""
        dead = {pid for pid, start in self._pids.items() if not _alive(pid, start)}
        if not dead:
            return
        for key, (storage, _flag, pid) in list(self._mapped.items()):
            if pid in dead and use_count(storage) == 1:
                self._lent.discard(key)
                del self._mapped[key]
        held = {pid for _s, _f, pid in self._mapped.values()}  # a dead worker's buffers still in use
        self._pids = {pid: start for pid, start in self._pids.items() if pid not in dead or pid in held}

    def sweep(self, _finalizing=sys.is_finalizing) -> None:
        """Free what nothing uses and drop the handles of dead workers' buffers.

        Not at interpreter shutdown: a loader's iterator collected then (torch's
        ``__del__`` shuts its workers down, coordl's iterator then sweeps) would find the
        builtins already gone (``open``, ``list``: NameError), and the process's handles go
        with it anyway. `_finalizing` is bound at import for the same reason."""
        if _finalizing():
            return
        with self._lock:
            self._release_unused()
            self._sweep()


def _alive(pid: int, start: int | None) -> bool:
    """Is the worker that was `pid` (started at `start`, when /proc told) still running? A zombie
    or a reused pid is not."""
    if start is not None:
        return shm.alive(pid, start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: The training process's lender: every coordl batch that arrives from a worker reports here.
LENDER = Lender()
