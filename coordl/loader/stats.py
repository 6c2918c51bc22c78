"""Loader counters, summed over every worker process.

The counters live in one small int64 tensor in shared memory, one row per
process: row 0 for the main process, row w+1 for worker w. A `Counters` is
made for a number of workers (the loader's ``num_workers``); each process
adds only to its own row, so no lock is needed between processes, and a
worker whose id has no row (a loader built over ``loader.dataset`` with more
workers than the loader that made the counters) is refused with
`ConfigError` rather than counted into another process's row. Worker
processes reach the tensor through the dataset: forked workers inherit its
mapping, spawned ones receive it by file descriptor when torch pickles the
dataset; it is freed when the last process drops it, so there is no named
segment to clean up.
"""

from __future__ import annotations

import numpy as np
import torch

from coordl.errors import ConfigError

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
    "moved_hits",      # partitioned cache: of local_hits + remote_hits, items read from their owner before
                       # the last node list update (then written to their owner now: cache_inserts)
    "ahead_hits",      # partitioned cache: of local_hits + remote_hits, items whose MGET went out a batch
                       # ahead (PartitionedCache read_ahead), read while the batch before was prepared
    "storage_requests",  # object storage (a dataset at a URL): GET requests sent, retries included
    "storage_retries",   # object storage: GETs retried after throttling, a 5xx, a timeout or a lost connection
    "gpu_decodes",       # DataLoader(device=...): images the batch decoder (GPU, or its CPU stand-in) decoded
    "gpu_cpu_fallbacks",  # ... images it refused or does not take (progressive, CMYK...), decoded on the CPU
    "gpu_prep_us",       # ... microseconds the training process spent decoding and augmenting batches
    "gpu_buffer_misses",  # ... batches that found every pool buffer in use (device_buffers): a new tensor
)
_INDEX = {k: i for i, k in enumerate(KEYS)}


class Counters:
    """Per-process rows of cumulative counters in shared memory: the main process and
    `num_workers` worker processes."""

    def __init__(self, num_workers: int) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r} must be an int >= 0 (0: load in the main "
                              "process)")
        self._table = torch.zeros((int(num_workers) + 1, len(KEYS)), dtype=torch.int64).share_memory_()
        self._view: np.ndarray | None = None

    @property
    def workers(self) -> int:
        """The worker processes these counters have a row for."""
        return self._table.shape[0] - 1

    def __getstate__(self) -> dict:
        return {"_table": self._table, "_view": None}

    def _row(self) -> np.ndarray:
        if self._view is None:
            self._view = self._table.numpy()
        info = torch.utils.data.get_worker_info()
        if info is None:
            return self._view[0]
        if info.id >= self.workers:
            raise ConfigError(
                f"worker {info.id} of {info.num_workers} has no row in these loader counters, made for "
                f"num_workers={self.workers}: a loader built over a coordl.DataLoader's dataset "
                f"(loader.dataset) may start at most that many workers. Pass num_workers<="
                f"{self.workers} to it, or build a new coordl.DataLoader over your original dataset")
        return self._view[info.id + 1]

    def add(self, **amounts: int) -> None:
        """Add to this process's row: ``counters.add(decodes=3, storage_bytes=n)``."""
        row = self._row()
        for key, n in amounts.items():
            row[_INDEX[key]] += n

    def totals(self) -> dict[str, int]:
        """The sum over all processes, one int per key of `KEYS`."""
        sums = self._table.sum(dim=0).tolist()
        return dict(zip(KEYS, (int(s) for s in sums)))
