"""`coordl.DataLoader`: a `torch.utils.data.DataLoader` that knows coordl datasets.

It is an instance of torch's DataLoader and takes every one of its arguments
with the same meaning; any dataset behaves exactly as under torch. With a
coordl dataset (one that splits ``fetch``/``prep``, e.g. `coordl.ImageFolder`)
it additionally:

- counts epochs (each ``iter(loader)`` is one; `set_epoch` to resume) and
  tags every batch of indices with its epoch (`EpochBatch`), so augmentation
  is a pure function of (seed, epoch, item) even in persistent workers;
- collates the dataset's prepared batch without a copy: uint8 (B, 3, H, W)
  in channels_last memory format and int64 labels;
- lets each worker reuse a batch's shared-memory buffer once no tensor in the
  training process refers to that batch any more (coordl/buffers.py). A batch
  you keep stays yours; one you hand to *another process* (a multiprocessing
  queue) is not tracked there: clone() it first, or pass ``reuse_buffers=False``;
- sums counters over all worker processes: `stats()`;
- with ``cache="8GiB"`` (or a `coordl.MinIOCache`), serves items through the
  node-wide MinIO cache and reads storage without filling the page cache
  (``drop_page_cache``, on by default with a cache);
- with ``coordinator="unix:///path.sock"``, takes its batches from a
  `coordl serve` daemon that prepares each batch once for every job on the
  server (coordinator/client.py): `len`, the epoch loop and the batches are
  the same, the tensors view shared memory until the next batch is asked for.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import default_collate
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from .buffers import EXTRA_SLOTS, BatchPool, Lender
from .caching import cache_for
from .coordinator.client import connect
from .dataset import PreparedBatch
from .errors import ConfigError
from .stats import Counters


class EpochBatch(list):
    """A batch of dataset indices that carries the epoch it belongs to."""

    def __init__(self, indices, epoch: int) -> None:
        super().__init__(indices)
        self.epoch = epoch

    def __reduce__(self):
        return EpochBatch, (list(self), self.epoch)


class EpochIndex(int):
    """One dataset index (no auto-batching) that carries its epoch."""

    def __new__(cls, index: int, epoch: int) -> EpochIndex:
        obj = super().__new__(cls, index)
        obj.epoch = epoch
        return obj

    def __reduce__(self):
        return EpochIndex, (int(self), self.epoch)


class _EpochTagged:
    """Wraps the loader's index sampler; reads the loader's epoch each time it is iterated.

    torch's iterators keep the index sampler they were built with and re-iterate it
    for every epoch of persistent workers, so the epoch is read here, not stored.
    The loader is held by weak reference: iterator -> sampler -> loader would
    otherwise form a cycle that keeps worker processes alive until gc runs.
    """

    def __init__(self, sampler, loader: DataLoader, batched: bool) -> None:
        self.sampler, self.batched = sampler, batched
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator:
        tag = EpochBatch if self.batched else EpochIndex
        loader = self._loader()
        epoch = loader.epoch if loader is not None else 0
        del loader  # a suspended generator (an epoch left unfinished) must not keep the loader alive
        for item in self.sampler:
            yield tag(item, epoch)

    def __len__(self) -> int:
        return len(self.sampler)


class Batch(list):
    """[images, labels] as torch's collate gives them, plus the (worker, slot) of the images'
    reusable buffer (coordl/buffers.py) or None."""

    def __init__(self, items, slot: tuple[int, int] | None = None) -> None:
        super().__init__(items)
        self.slot = slot

    def __reduce__(self):
        return Batch, (list(self), self.slot)


def collate(batch: Any) -> Any:
    """Collate for coordl datasets: a `PreparedBatch` as is, anything else as torch does."""
    if isinstance(batch, PreparedBatch):
        return Batch([batch.images, batch.labels], batch.slot)
    return default_collate(batch)


class _PooledIter(_MultiProcessingDataLoaderIter):
    """torch's multi-process iterator that gives a batch's buffer back to its worker once
    the training step no longer refers to it (coordl/buffers.py)."""

    def __init__(self, loader: DataLoader, pool: BatchPool) -> None:
        self._lender = Lender(pool)
        self._discarding = False
        super().__init__(loader)

    def _reset(self, loader, first_iter: bool = False) -> None:
        # persistent workers, an epoch left unfinished: torch drops the batches it holds out of
        # order (_task_info) and drains and drops those still in flight (_get_data below)
        for info in getattr(self, "_task_info", {}).values():
            if len(info) == 2:
                self._discard(info[1])
        self._discarding = not first_iter
        try:
            super()._reset(loader, first_iter)
        finally:
            self._discarding = False

    def _get_data(self):
        idx, data = super()._get_data()
        if self._discarding:
            self._discard(data)
        return idx, data

    def _discard(self, data) -> None:
        slot = getattr(data, "slot", None)
        if slot is not None:
            self._lender.discarded(*slot)

    def __next__(self):
        self._lender.release_unused()
        batch = super().__next__()
        slot = getattr(batch, "slot", None)
        if slot is not None:
            self._lender.received(batch[0], *slot)
        return batch


def is_coordl_dataset(dataset: Any) -> bool:
    return all(callable(getattr(dataset, a, None)) for a in ("fetch", "prep", "set_epoch"))


class DataLoader(torch.utils.data.DataLoader):
    """Drop-in replacement for `torch.utils.data.DataLoader`; see the module docstring."""

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        cache=None,
        drop_page_cache: bool | None = None,
        coordinator: str | None = None,
        reuse_buffers: bool = True,
    ) -> None:
        coordl_ds = is_coordl_dataset(dataset)
        batched = batch_size is not None or batch_sampler is not None
        if coordl_ds and collate_fn is None and batched:
            collate_fn = collate
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        self._coordl_dataset = coordl_ds
        self.reuse_buffers = bool(reuse_buffers)
        self._next_epoch = 0
        self.epoch = -1
        self._counters = Counters(num_workers)
        if coordl_ds:
            dataset.counters = self._counters
        _setup_cache(dataset, coordl_ds, cache, drop_page_cache)
        self.coordinator = None if coordinator is None else connect(
            coordinator, dataset, batch_size, shuffle, drop_last, timeout,
            custom=[a for a, v in (("sampler", sampler), ("batch_sampler", batch_sampler),
                                   ("collate_fn", collate_fn)) if v not in (None, collate)])

    @property
    def _index_sampler(self):
        sampler = super()._index_sampler
        if not self._coordl_dataset:
            return sampler
        return _EpochTagged(sampler, self, self._auto_collation)

    def _get_iterator(self):
        # a new set of worker processes starts here: give them a new pool of batch buffers
        if (self._coordl_dataset and self.reuse_buffers and self.num_workers > 0
                and self.collate_fn is collate and self._auto_collation):
            self.dataset.batch_pool = BatchPool(self.num_workers, self.prefetch_factor + EXTRA_SLOTS)
            return _PooledIter(self, self.dataset.batch_pool)
        return super()._get_iterator()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter(loader)`` runs (to resume a run at epoch ``epoch``)."""
        self._next_epoch = int(epoch)

    def __len__(self) -> int:
        coordinator = getattr(self, "coordinator", None)
        return super().__len__() if coordinator is None else len(coordinator)

    def __iter__(self):
        if self.coordinator is not None:  # batches come from the daemon: coordinator/client.py
            epoch = self.coordinator.epoch(self.pin_memory)
            self.epoch = epoch.epoch
            return epoch
        self.epoch = self._next_epoch
        self._next_epoch += 1
        if self._coordl_dataset:
            self.dataset.set_epoch(self.epoch)
            self.dataset.counters = self._counters
        return super().__iter__()

    def stats(self) -> dict[str, int]:
        """Counters summed over the main and all worker processes, over the loader's life;
        with a cache also its node-wide state: cache_bytes, cache_items, cache_capacity."""
        totals = self._counters.totals()
        cache = getattr(self.dataset, "cache", None) if self._coordl_dataset else None
        if cache is not None:
            totals.update(cache.stats())
        return totals


def _setup_cache(dataset, coordl_ds: bool, cache, drop_page_cache: bool | None) -> None:
    """Open the MinIO cache for a coordl dataset (``cache=``) and set how storage is read."""
    if cache is None and drop_page_cache is None:
        return
    if not coordl_ds:
        raise ConfigError(f"cache= and drop_page_cache= need a coordl dataset (one with fetch/prep, "
                          f"e.g. coordl.ImageFolder), not {type(dataset).__name__}: leave them unset")
    if cache is not None:
        dataset.cache = cache_for(dataset, cache)
    dataset.drop_page_cache = dataset.cache is not None if drop_page_cache is None else bool(drop_page_cache)
