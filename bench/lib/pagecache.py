"""Storage I/O as the kernel counts it, for the cache benchmarks.

    evict(paths)        drop the files' pages from the page cache (each run starts cold)
    read_bytes(pids)    bytes those processes read from storage (/proc/<pid>/io read_bytes)
"""

from __future__ import annotations

from coordl.cache.storage.localfile import evict  # noqa: F401  (re-exported for the benchmarks)


def read_bytes(pids: list[int]) -> int:
    """Sum of read_bytes over `pids` (a process that has exited counts 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io") as f:
                total += next(int(ln.split()[1]) for ln in f if ln.startswith("read_bytes"))
        except (OSError, StopIteration):
            pass
    return total
