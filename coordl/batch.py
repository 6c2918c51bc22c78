"""A batch on its way out: what both loaders (CPU workers and DALI) and the coordinator client hand over.

- `PreparedBatch`: what a coordl dataset's ``__getitems__`` returns in a worker: the (image, label) views
  torch's default_collate would take, plus the stacked tensors themselves.
- `collate`: coordl's collate_fn: a `PreparedBatch` becomes a `Batch` without a copy; anything else is
  collated as torch does.
- `Batch`: [images, labels] as torch's collate gives them; unpickling one in the training process
  reports a pooled buffer to the lender (coordl/buffers.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import default_collate

from coordl.buffers import LENDER


class PreparedBatch(list):
    """A batch built by `__getitems__`: a list of (image, label) views, for
    torch's default_collate, that also carries the stacked tensors so that
    coordl's collate returns them without a copy, and
    whether its buffer is one of a worker's reusable ones (coordl/buffers.py)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, indices: list[int],
                 pooled: bool = False):
        super().__init__(zip(images, labels.tolist()))
        self.images, self.labels, self.indices, self.pooled = images, labels, indices, pooled


class Batch(list):
    """[images, labels] as torch's collate gives them; `pooled` when the images are in one of a
    worker's reusable buffers, which the process that unpickles the batch reports to the lender
    (coordl/buffers.py), whichever iterator received it."""

    def __init__(self, items, pooled: bool = False) -> None:
        super().__init__(items)
        self.pooled = pooled

    def __reduce__(self):
        return _arrived, (list(self), self.pooled)


def _arrived(items, pooled: bool) -> Batch:
    if pooled:
        LENDER.arrived(items[0])
    return Batch(items)


class EncodedBatch:
    """A batch of encoded bytes and their plans (pipelines/batchprep.py `ItemPlan`), what a worker
    sends with ``DataLoader(device=...)``: the training process decodes it (coordl/loader/devprep.py)."""

    def __init__(self, raws: list, plans: list, items: list[int], labels: Any) -> None:
        self.raws, self.plans, self.items, self.labels = raws, plans, items, labels


def collate(batch: Any) -> Any:
    """Collate for coordl datasets: a `PreparedBatch` (or `EncodedBatch`) as is, anything else as torch does."""
    if isinstance(batch, EncodedBatch):
        return batch
    if isinstance(batch, PreparedBatch):
        return Batch([batch.images, batch.labels], batch.pooled)
    if isinstance(batch, list) and not batch:  # a user dataset's batch whose every item was skipped
        return []                              # (on_error="skip"): no sample to stack, so no structure
    return default_collate(batch)
