"""The iterators `coordl.DataLoader` hands out: torch's own, plus position counting.

Both are subclasses of torch's iterator classes (isinstance holds, persistent
workers and `_reset` work as in torch). Each counts the batches the training
loop has *received* into the loader's `Position` (what `state_dict` saves:
not what workers prefetched). `_PooledIter` also gives a batch's
shared-memory buffer back to its worker once nothing in the training process
refers to it (coordl/buffers.py).

NOTE (torch internals relied on): `_MultiProcessingDataLoaderIter._reset`,
`_get_data` and `_task_info` (torch 2.6-2.13); `_BaseDataLoaderIter.__next__`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from .buffers import BatchPool, Lender


@dataclass
class Position:
    """Where the training loop is: the epoch of the last `iter(loader)` and the batches of it
    the loop has received (including those skipped by `load_state_dict`)."""

    epoch: int = -1
    received: int = 0
    length: int | None = None  # batches in that epoch, when the loader has a length
    active: bool = False       # an epoch was started and has not run out

    @property
    def unfinished(self) -> bool:
        return self.active and (self.length is None or self.received < self.length)


class _Counting:
    _position: Position

    def __next__(self):
        try:
            batch = super().__next__()
        except StopIteration:
            self._position.active = False
            raise
        self._position.received += 1
        return batch


class SingleIter(_Counting, _SingleProcessDataLoaderIter):
    def __init__(self, loader, position: Position) -> None:
        self._position = position
        super().__init__(loader)


class MultiIter(_Counting, _MultiProcessingDataLoaderIter):
    def __init__(self, loader, position: Position) -> None:
        self._position = position
        super().__init__(loader)


class PooledIter(MultiIter):
    """A multi-process iterator whose workers reuse batch buffers (coordl/buffers.py)."""

    def __init__(self, loader, position: Position, pool: BatchPool) -> None:
        self._lender = Lender(pool)
        self._discarding = False
        super().__init__(loader, position)

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
