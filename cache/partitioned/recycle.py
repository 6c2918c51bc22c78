"""Reused receive buffers: a value's memory, faulted in once, taken again once nobody holds it.

    pool = BufferPool(32 * 2**20)
    buf = pool.take(nbytes)      # a uint8 ndarray of at least nbytes; fill it, hand out views of it
    ...                          # when every view of it is gone, a later take may return it again

Reading an MGET reply into a fresh ``np.empty`` per value made the kernel find and zero new
pages for each ~100 KiB value while it copied the socket's bytes in (and glibc gave them
back after each batch): page faults were a third of a worker's extra CPU per remote item
over the shaped network of bench/cluster.py, ~60 us of ~170 us per 117 KiB value
(docs/results.md, "Partitioned caching over a shaped network"). Buffers taken from a pool are
already mapped.

A buffer is free when nothing but the pool refers to it: every memoryview of it (and any
numpy or torch array made from one) holds a reference to it, so its reference count says
whether a consumer still holds it; it is never reused while one does. The pool looks at its
oldest buffers first (a batch's values are let go together, before the next batch is read),
at most `_LOOK` of them per take, and holds at most `capacity` bytes in all, in use or free:
past that, takes are plain allocations the pool forgets. A new buffer has room for a value an
eighth larger; one that is free but too small is kept for smaller values, and let go when the
pool needs its room, so the pool follows the values' sizes. One pool per process (`process_pool`):
a forked child starts with an empty one.
"""

from __future__ import annotations

import collections
import sys
import threading

import numpy as np

from ..forkguard import ForkGuard

_LOOK = 8            # pooled buffers looked at per take, oldest first
_ROUND = 16 * 2**10  # sizes are rounded up to this, so values of close sizes share buffers
CAPACITY = 32 * 2**20  # bytes a process's pool holds (about 4 batches of 64 ~100 KiB values)


class BufferPool:
    """Reusable uint8 buffers, at most `capacity` bytes of them (see the module docstring)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._bufs: collections.deque[np.ndarray] = collections.deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self.made = 0     # buffers allocated by takes (pooled or not)
        self.reused = 0   # takes answered with a pooled buffer

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 array of at least `nbytes` that nothing else refers to."""
        size = -(-(nbytes + nbytes // 8) // _ROUND) * _ROUND  # room for a value a little larger
        with self._lock:
            bufs, buf = self._bufs, None
            for _ in range(min(_LOOK, len(bufs))):
                buf = bufs.popleft()
                if sys.getrefcount(buf) > _ALONE:  # a view of it is alive: look again later
                    bufs.append(buf)
                    continue
                if buf.nbytes >= nbytes:
                    bufs.append(buf)
                    self.reused += 1
                    return buf
                if self._bytes + size > self.capacity:  # free but too small, and room is needed
                    self._bytes -= buf.nbytes
                else:
                    bufs.append(buf)  # kept for a smaller value
            del buf
            self.made += 1
            new = np.empty(size, dtype=np.uint8)
            if self._bytes + size <= self.capacity:
                bufs.append(new)
                self._bytes += size
            return new

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers the pool holds now (in use or free)."""
        return self._bytes


def _alone() -> int:
    buf = np.empty(0)
    return sys.getrefcount(buf)   # a local name and getrefcount's argument: held by nothing else


_ALONE = _alone()
_pool: BufferPool | None = None
_fork = ForkGuard(owned=False)


def process_pool() -> BufferPool:
    """This process's pool (a new one in a forked child: the parent's buffers stay the parent's)."""
    global _pool
    if _pool is None or _fork.forked():
        _pool = BufferPool()
        _fork.reset()
    return _pool
