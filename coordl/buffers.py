"""Batch buffers in shared memory that a worker reuses once the training process has let go.

A worker that allocates a fresh shared-memory buffer for every batch pays
for it three times: the kernel allocates and zeroes every page (torch's
`_new_shared` fallocates), the worker takes a page fault on each page as it
writes the first image into it, and the training process maps the buffer
anew and faults again when it reads it. For 224x224 images that is ~0.17 ms
an image, ~9% of coordl's whole per-image cost (bench/results/steps-photo.md).

So each worker keeps a few buffers ("slots") and writes a batch into one
the training process no longer uses. Who may touch a slot is one byte in a
small shared table, `state[worker, slot]`:

    FREE -> LENT   the worker, when it starts writing a batch into the slot
    LENT -> FREE   the training process, once no tensor there refers to the
                   batch any more (the storage's use count is 1: only the
                   loader's own handle), or at once when pin_memory copied it

Each side writes only its own transition, so no lock is needed on x86-64,
whose total store order keeps the training process's last reads of a batch
before its FREE store. A weakly ordered CPU (aarch64, POWER) may let the worker
see FREE and overwrite the buffer before those reads are done, and nothing
here orders them, so `BatchPool` refuses to run there (`check_platform`:
pass ``reuse_buffers=False``). The MinIO cache has no such limit: its readers
verify a checksum and take the lock on a mismatch (cache/layout.py NOTE). A batch the
user keeps (a list of batches, gradient accumulation) keeps its slot LENT;
the worker then allocates a fresh buffer, as torch does, and counts it in
`stats()["batch_buffers"]`. The buffers are torch's anonymous shared memory
(file-descriptor strategy: no name in /dev/shm): a worker's die with it, the
training process's with the last tensor that views them.

A pool belongs to one set of worker processes: `coordl.DataLoader` makes a
new one whenever torch starts workers, so a slot number never refers to the
buffer of a worker that is gone.
"""

from __future__ import annotations

import platform

import numpy as np
import torch

from .errors import ConfigError

FREE, LENT = 0, 1
#: Slots per worker beyond prefetch_factor: the batch being written, the one
#: the training step holds, the one it just dropped (seen at the next batch).
EXTRA_SLOTS = 3


def use_count(storage: torch.UntypedStorage) -> int:
    """How many handles (tensors, storage objects) share this storage's memory in this process."""
    return torch._C._storage_Use_Count(storage._cdata)


def new_shared(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_shared(nbytes)


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


class BatchPool:
    """The slot table (shared) and, in a worker, that worker's buffers (process-local)."""

    def __init__(self, num_workers: int, slots: int) -> None:
        check_platform()
        self.state = torch.zeros((num_workers, slots), dtype=torch.uint8).share_memory_()
        self._flags: np.ndarray | None = None
        self._buffers: list[torch.UntypedStorage | None] = []

    def __getstate__(self) -> dict:
        return {"state": self.state, "_flags": None, "_buffers": []}

    @property
    def slots(self) -> int:
        return self.state.shape[1]

    # -- worker side --
    def acquire(self, worker: int, nbytes: int) -> tuple[torch.UntypedStorage, int | None, bool]:
        """(buffer of >= nbytes, its slot or None, whether it was newly allocated); marks it LENT."""
        if self._flags is None:
            self._flags = self.state.numpy()[worker]
            self._buffers = [None] * self.slots
        flags = self._flags
        for slot in range(self.slots):
            if flags[slot] != FREE:
                continue
            buf = self._buffers[slot]
            fresh = buf is None or buf.nbytes() < nbytes
            if fresh:
                self._buffers[slot] = None  # drop the small one first
                buf = self._buffers[slot] = new_shared(nbytes)
            flags[slot] = LENT
            return buf, slot, fresh
        return new_shared(nbytes), None, True

    def give_back(self, slot: int | None) -> None:
        """Worker side: the batch written into `slot` is not sent after all (it raised)."""
        if slot is not None and self._flags is not None:
            self._flags[slot] = FREE


class Lender:
    """Training-process side: watches the batches handed out and frees their slots when unused."""

    def __init__(self, pool: BatchPool) -> None:
        self.pool = pool
        self._state = pool.state.numpy()
        # (worker, slot) -> the one storage handle this process keeps, so that the buffer stays
        # mapped (torch's shared-storage cache maps the next batch in it to the same memory)
        self._mapped: dict[tuple[int, int], torch.UntypedStorage] = {}
        self._lent: set[tuple[int, int]] = set()

    def received(self, images: torch.Tensor, worker: int, slot: int) -> None:
        key = (worker, slot)
        storage = images.untyped_storage()
        if not storage.is_shared():
            # pin_memory copied the batch and dropped the shared buffer already
            self._state[key] = FREE
            return
        kept = self._mapped.get(key)
        if kept is None or kept.data_ptr() != storage.data_ptr():
            self._mapped[key] = storage  # first time, or the worker replaced the buffer
        del storage  # exactly one handle of ours, so that use_count == 1 means "unused"
        self._lent.add(key)

    def discarded(self, worker: int, slot: int) -> None:
        """A batch that is dropped unseen (an epoch left unfinished): its slot is free at once."""
        self._state[worker, slot] = FREE

    def release_unused(self) -> None:
        """Give back every slot whose batch no tensor refers to any more."""
        for key in [k for k in self._lent if use_count(self._mapped[k]) == 1]:
            self._lent.discard(key)
            self._state[key] = FREE
