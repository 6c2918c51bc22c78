"""Threads for the manifest's system calls, started only when they are waited on.

A scan's `stat` calls and a restart's checks are cheap system calls when the
metadata is in memory, and then threads only cost: every call releases and
retakes the GIL, and on a machine with few cores the hand-offs make 8 threads
slower than one. When the metadata is not in memory (cold page cache, network
filesystems) each call waits on a read, and threads keep many in flight.

`spread_map(fn, items, threads)` is ``[fn(x) for x in items]``. It starts on
the calling thread and measures the time that thread was *blocked*: off the
CPU without waiting for one (wall time - the thread's CPU time - its run-queue
delay from /proc/thread-self/schedstat, so CPU contention from other processes
is not counted). Once the items so far were blocked for more than
BLOCKED_MIN_NS in all and a quarter of their time, `threads - 1` helper
threads join in for the items left. Warm metadata keeps everything on one
thread (a few inodes the kernel had evicted do not turn threads on); cold
storage gets them after its first items.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

BLOCKED_MIN_NS = 20_000_000  # in all, since the start: a stray cold inode is not a cold tree


class _Blocked:
    """Time the calling thread spends blocked (see the module docstring)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None  # no schedstat: CPU waits count as blocked (errs towards threads)

    def _busy_ns(self) -> int:
        # the CPU time from the clock: schedstat's first field lags up to a scheduler tick for a
        # thread that is running (it is what reads it)
        if self._fd is not None:
            return time.thread_time_ns() + int(os.pread(self._fd, 64, 0).split()[1])
        return time.thread_time_ns()

    def mark(self) -> tuple[int, int]:
        return time.perf_counter_ns(), self._busy_ns()

    def blocked_since(self, mark: tuple[int, int]) -> bool:
        """Blocked for more than BLOCKED_MIN_NS in all, and a quarter of the time, since `mark`."""
        wall = time.perf_counter_ns() - mark[0]
        blocked = wall - (self._busy_ns() - mark[1])
        return blocked > BLOCKED_MIN_NS and 4 * blocked > wall

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


def spread_all(fn: Callable[[T], R], items: Sequence[T], threads: int, name: str = "coordl-manifest") -> list[R]:
    """`spread_map` without `until`: every item's result is there (none is left None)."""
    return cast("list[R]", spread_map(fn, items, threads, name=name))


def spread_map(fn: Callable[[T], R], items: Sequence[T], threads: int,
               until: Callable[[R], bool] | None = None, name: str = "coordl-manifest") -> list[R | None]:
    """``[fn(x) for x in items]``, on up to `threads` threads once the caller is seen blocked.

    `until(result)` true stops the rest (their results stay None). An exception in `fn` stops
    the rest too and is raised here, once every thread has stopped."""
    results: list[R | None] = [None] * len(items)
    lock = threading.Lock()
    state = {"next": 0, "stop": False}
    errors: list[BaseException] = []

    def take() -> int:
        with lock:
            if state["stop"] or state["next"] >= len(items):
                return -1
            state["next"] += 1
            return state["next"] - 1

    def one(i: int) -> None:
        try:
            r = results[i] = fn(items[i])
        except BaseException as e:  # noqa: BLE001 (raised again by spread_map, on its caller's thread)
            errors.append(e)
            state["stop"] = True
            return
        if until is not None and until(r):
            state["stop"] = True

    def helper() -> None:
        while (i := take()) >= 0:
            one(i)

    helpers: list[threading.Thread] = []
    clock = _Blocked() if threads > 1 else None
    mark = clock.mark() if clock is not None else None
    try:
        while (i := take()) >= 0:
            one(i)
            if clock is not None and mark is not None and not helpers and clock.blocked_since(mark):
                for k in range(threads - 1):
                    t = threading.Thread(target=helper, name=f"{name}-{k}", daemon=True)
                    try:
                        t.start()
                    except RuntimeError:  # no more threads: go on with those there are
                        break
                    helpers.append(t)
    finally:
        state["stop"] = True  # normally nothing is left; after an exception here, stop the helpers
        if clock is not None:
            clock.close()
        for t in helpers:
            t.join()
    if errors:
        raise errors[0]
    return results
