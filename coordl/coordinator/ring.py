"""The ring: K shared-memory slots, each holding one prepared batch.

One segment (segments.py) per daemon, laid out as

    meta     int64[16]         magic, version, daemon pid and start time, K, B, the sample's
                               dtype (its index in protocol.SAMPLE_DTYPES), dimensions, shape
    socket   bytes[384]        the daemon's socket path (for `coordl cleanup`), NUL-padded
    table    int64[K, 4]       per slot: state, batch index, epoch, valid rows (a mirror, see below)
    labels   int64[K, B]
    ids      int64[K, B]       dataset item index of each row
    samples  dtype[K, B, *shape]   page-aligned; an image ring's: uint8[K, B, size, size, 3]

The sample's shape and dtype are the daemon's sample spec (spec.py). Prep
workers write rows of `labels`, `ids` and `samples` of a FILLING slot;
nothing else writes the data arrays. The daemon alone decides slot states and
holders (`SlotTable`, in its own memory) and mirrors them into `table` for
readers that want to check (`coordl status`, a job verifying its slot). Jobs
map the segment read-only: the tensors they get are views of `samples` and
`labels`.

Slot states and the legal transitions (`SlotTable` raises on any other):

    FREE ──claim──> FILLING ──publish──> READY ──last holder releases──> FREE
                       └──────fail─────> FAILED ──last holder releases──> FREE

A slot is READY or FAILED for the set of jobs that need its batch (its
holders, fixed when it is published; a job that attaches later and starts at
or before that batch is added). It becomes FREE when the set is empty: every
holder released it, detached or died.
"""

from __future__ import annotations

import enum
import math
import mmap
import os
from dataclasses import dataclass

import numpy as np

from coordl.errors import CoordinatorError

from . import segments
from .protocol import MAX_SAMPLE_DIMS, SAMPLE_DTYPES, Failure

MAGIC = int.from_bytes(b"CODRING1", "little")
VERSION = 2  # 2: any sample shape and dtype (was: uint8 images)
_META, _META_LEN = 0, 16
_SOCKET_OFF, _SOCKET_LEN = 128, 384
_TABLE_OFF = 512
_PID, _START, _SLOTS, _BATCH, _DTYPE, _NDIM, _SHAPE = 2, 3, 4, 5, 6, 7, 8
_LAYOUT = slice(_SLOTS, _SHAPE + MAX_SAMPLE_DIMS)  # the meta fields Layout.meta gives
STATE, INDEX, EPOCH, ROWS = 0, 1, 2, 3   # columns of the slot table


class SlotState(enum.IntEnum):
    FREE = 0      # no batch; the producer may claim it
    FILLING = 1   # claimed for one batch; prep workers are writing its rows
    READY = 2     # every row written; its holders read it
    FAILED = 3    # a row could not be prepared; its holders get the error instead


LEGAL: dict[SlotState, frozenset[SlotState]] = {
    SlotState.FREE: frozenset({SlotState.FILLING}),
    SlotState.FILLING: frozenset({SlotState.READY, SlotState.FAILED}),
    SlotState.READY: frozenset({SlotState.FREE}),
    SlotState.FAILED: frozenset({SlotState.FREE}),
}


@dataclass(frozen=True)
class Layout:
    """Where everything lies in the segment: a pure function of (slots, batch_size, sample shape,
    dtype) (the sample spec, spec.py)."""
    slots: int
    batch_size: int
    shape: tuple[int, ...]   # one sample (row): an image ring's (size, size, 3)
    dtype: str = "uint8"     # its numpy dtype name (protocol.SAMPLE_DTYPES)

    @classmethod
    def images(cls, slots: int, batch_size: int, size: int) -> Layout:
        """The ring of uint8 (size, size, 3) images (coordl serve --data, --size)."""
        return cls(slots, batch_size, (size, size, 3), "uint8")

    @property
    def meta(self) -> list[int]:
        """What the meta block records of the layout (_LAYOUT: K, B, dtype, dimensions, shape)."""
        dims = list(self.shape) + [0] * (MAX_SAMPLE_DIMS - len(self.shape))
        return [self.slots, self.batch_size, SAMPLE_DTYPES.index(self.dtype), len(self.shape), *dims]

    @property
    def table_bytes(self) -> int:
        return self.slots * 4 * 8

    @property
    def labels_offset(self) -> int:
        return _round_up(_TABLE_OFF + self.table_bytes, 64)

    @property
    def ids_offset(self) -> int:
        return self.labels_offset + self.slots * self.batch_size * 8

    @property
    def samples_offset(self) -> int:
        return _round_up(self.ids_offset + self.slots * self.batch_size * 8, mmap.PAGESIZE)

    @property
    def slot_sample_bytes(self) -> int:
        return self.batch_size * math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def total_bytes(self) -> int:
        return self.samples_offset + self.slots * self.slot_sample_bytes


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Ring:
    """A mapping of the ring segment with numpy views of each region."""

    def __init__(self, mm: mmap.mmap, layout: Layout, path: str, writable: bool) -> None:
        self.mm, self.layout, self.path, self.writable = mm, layout, path, writable
        k, b = layout.slots, layout.batch_size
        self.meta = np.ndarray((_META_LEN,), np.int64, mm, _META)
        self.table = np.ndarray((k, 4), np.int64, mm, _TABLE_OFF)
        self.labels = np.ndarray((k, b), np.int64, mm, layout.labels_offset)
        self.ids = np.ndarray((k, b), np.int64, mm, layout.ids_offset)
        self.samples = np.ndarray((k, b, *layout.shape), np.dtype(layout.dtype), mm, layout.samples_offset)

    @classmethod
    def create(cls, name: str, layout: Layout, socket_path: str) -> Ring:
        """Create the segment `name` (the daemon; it unlinks it with `unlink`)."""
        fd, path = segments.create(name, layout.total_bytes)
        try:
            mm = mmap.mmap(fd, layout.total_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            segments.unlink(path)
            raise
        os.close(fd)
        ring = cls(mm, layout, path, writable=True)
        ring.meta[:] = 0
        ring.meta[[_PID, _START]] = (os.getpid(), segments.proc_start(os.getpid()) or 0)
        ring.meta[_LAYOUT] = layout.meta
        ring.meta[1] = VERSION
        sock = os.fsencode(socket_path)[:_SOCKET_LEN]
        mm[_SOCKET_OFF:_SOCKET_OFF + len(sock)] = sock
        ring.meta[0] = MAGIC  # last: a reader that sees the magic sees the rest
        return ring

    @classmethod
    def attach(cls, path: str, layout: Layout) -> Ring:
        """Map an existing ring read-only (a job), checking it is what the daemon said."""
        try:
            mm = segments.map_file(path, writable=False)
        except OSError as e:
            raise CoordinatorError(f"cannot map the coordinator's ring {path!r}: {e.strerror}: "
                                   "is the daemon running as another user?") from None
        if len(mm) != layout.total_bytes:
            size = len(mm)
            mm.close()
            raise CoordinatorError(f"ring {path!r} has {size} bytes, expected "
                                   f"{layout.total_bytes}: the daemon and this job run different "
                                   "coordl versions")
        ring = cls(mm, layout, path, writable=False)
        if int(ring.meta[0]) != MAGIC or int(ring.meta[1]) != VERSION:
            ring.close()
            raise CoordinatorError(f"{path!r} is not a coordl ring of version {VERSION}")
        if [int(v) for v in ring.meta[_LAYOUT]] != layout.meta:
            ring.close()
            raise CoordinatorError(f"ring {path!r} records another layout than the daemon's welcome "
                                   f"({layout}): the daemon and this job run different coordl versions")
        return ring

    @staticmethod
    def read_socket_path(path: str) -> str | None:
        """The socket path recorded in the ring segment at `path` (for cleanup)."""
        try:
            with open(path, "rb") as f:
                head = f.read(_SOCKET_OFF + _SOCKET_LEN)
        except OSError:
            return None
        if len(head) < _SOCKET_OFF + _SOCKET_LEN or int.from_bytes(head[:8], "little") != MAGIC:
            return None
        raw = head[_SOCKET_OFF:].split(b"\0", 1)[0]
        return os.fsdecode(raw) or None

    def close(self) -> None:
        """Drop the views and unmap (a view still referenced elsewhere keeps the pages)."""
        for name in ("meta", "table", "labels", "ids", "samples"):
            self.__dict__.pop(name, None)
        try:
            self.mm.close()
        except BufferError:  # tensors still view it: the mapping goes with the last of them
            pass

    def unlink(self) -> None:
        segments.unlink(self.path)


class SlotTable:
    """Slot states and holders (the daemon's own memory), mirrored into the ring's table."""

    def __init__(self, slots: int, mirror: np.ndarray | None = None) -> None:
        self.state = [SlotState.FREE] * slots
        self.index = [-1] * slots            # the batch each non-free slot holds
        self.rows = [0] * slots              # valid rows of a READY slot
        self.error: list[Failure | None] = [None] * slots  # a FAILED slot's (protocol.py)
        self.holders: list[set[int]] = [set() for _ in range(slots)]
        self.by_index: dict[int, int] = {}   # batch index -> slot, for every non-free slot
        self.mirror = mirror
        if mirror is not None:
            mirror[:] = 0
            mirror[:, INDEX] = -1

    def _move(self, slot: int, to: SlotState) -> None:
        now = self.state[slot]
        if to not in LEGAL[now]:
            raise RuntimeError(f"slot {slot}: illegal transition {now.name} -> {to.name}")
        self.state[slot] = to
        if self.mirror is not None:
            self.mirror[slot, STATE] = to

    def free_slot(self) -> int | None:
        for slot, state in enumerate(self.state):
            if state is SlotState.FREE:
                return slot
        return None

    def claim(self, slot: int, index: int, epoch: int) -> None:
        self._move(slot, SlotState.FILLING)
        self.index[slot], self.rows[slot], self.error[slot] = index, 0, None
        self.by_index[index] = slot
        if self.mirror is not None:
            self.mirror[slot, INDEX], self.mirror[slot, EPOCH], self.mirror[slot, ROWS] = index, epoch, 0

    def publish(self, slot: int, rows: int, holders: set[int]) -> bool:
        """FILLING -> READY for `holders`; True when nobody needs it and it was freed at once."""
        self._move(slot, SlotState.READY)
        self.rows[slot] = rows
        if self.mirror is not None:
            self.mirror[slot, ROWS] = rows
        return self._hold_or_free(slot, holders)

    def fail(self, slot: int, error: Failure, holders: set[int]) -> bool:
        self._move(slot, SlotState.FAILED)
        self.error[slot] = error
        return self._hold_or_free(slot, holders)

    def _hold_or_free(self, slot: int, holders: set[int]) -> bool:
        self.holders[slot] = set(holders)
        if not holders:
            self._free(slot)
            return True
        return False

    def hold(self, slot: int, job: int) -> None:
        """A job that attached late needs the batch already published in `slot`."""
        if self.state[slot] in (SlotState.READY, SlotState.FAILED):
            self.holders[slot].add(job)

    def release(self, slot: int, job: int) -> bool:
        """`job` is done with `slot`; True when that freed it."""
        holders = self.holders[slot]
        if job not in holders or self.state[slot] not in (SlotState.READY, SlotState.FAILED):
            return False
        holders.discard(job)
        if not holders:
            self._free(slot)
            return True
        return False

    def drop(self, job: int) -> list[int]:
        """`job` detached: release everything it holds; the slots that freed."""
        return [s for s in range(len(self.state)) if self.release(s, job)]

    def _free(self, slot: int) -> None:
        self._move(slot, SlotState.FREE)
        self.by_index.pop(self.index[slot], None)
        self.index[slot], self.rows[slot], self.error[slot] = -1, 0, None
        if self.mirror is not None:
            self.mirror[slot, INDEX], self.mirror[slot, ROWS] = -1, 0

    def oldest(self) -> int | None:
        """The lowest batch index in the ring (any non-free slot), or None when it is empty."""
        return min(self.by_index) if self.by_index else None

    def counts(self) -> dict[str, int]:
        return {s.name.lower(): self.state.count(s) for s in SlotState}
