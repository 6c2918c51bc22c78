"""Loader counters, summed over every worker process.

The counters live in one small int64 tensor in shared memory, one row per
process (row 0: the main process, row w+1: worker w), so that each process
writes only its own row and no lock is needed. torch passes the tensor to
worker processes by file descriptor when it pickles the dataset, and frees it
when the last process drops it: there is no named segment to clean up.
"""

from __future__ import annotations

import numpy as np
import torch

#: Every key `DataLoader.stats()` reports, in row order.
KEYS: tuple[str, ...] = (
    "storage_reads",   # files read from storage
    "storage_bytes",   # file bytes read from storage
    "decodes",         # images decoded (successful or not)
    "samples",         # samples produced (after skips)
    "errors_skipped",  # samples dropped because on_error="skip"
    "cache_hits",      # items served from the MinIO cache
    "cache_misses",    # items looked up in the cache and not found
    "cache_inserts",   # items this loader's processes added to the cache
    "batch_buffers",   # shared-memory batch buffers workers allocated (the rest reused one)
    "local_hits",      # partitioned cache: items served by this server's own cache node
    "remote_hits",     # partitioned cache: items served by another server's cache node
    "remote_bytes",    # partitioned cache: bytes received from other servers' cache nodes
    "remote_errors",   # partitioned cache: values refused (bad checksum/header) or nodes that failed
)
_INDEX = {k: i for i, k in enumerate(KEYS)}


class Counters:
    """Per-process rows of cumulative counters in shared memory."""

    def __init__(self, num_workers: int) -> None:
        self._table = torch.zeros((num_workers + 1, len(KEYS)), dtype=torch.int64).share_memory_()
        self._view: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {"_table": self._table, "_view": None}

    def _row(self) -> np.ndarray:
        if self._view is None:
            self._view = self._table.numpy()
        info = torch.utils.data.get_worker_info()
        row = 0 if info is None else info.id + 1
        return self._view[min(row, self._view.shape[0] - 1)]

    def add(self, **amounts: int) -> None:
        """Add to this process's row: ``counters.add(decodes=3, storage_bytes=n)``."""
        row = self._row()
        for key, n in amounts.items():
            row[_INDEX[key]] += n

    def totals(self) -> dict[str, int]:
        """The sum over all processes, one int per key of `KEYS`."""
        sums = self._table.sum(dim=0).tolist()
        return dict(zip(KEYS, (int(s) for s in sums)))
