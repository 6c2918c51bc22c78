"""The iterators `coordl.DataLoader` hands out: torch's own, plus position counting.

Both are subclasses of torch's iterator classes (isinstance holds, persistent
workers and `_reset` work as in torch). Each counts the batches the training
loop has *received* into the loader's `Position` (what `state_dict` saves:
not what workers prefetched). Batch buffers go back to their workers whatever
iterator received them (coordl/buffers.py); `MultiIter` only drops this
process's handles of its workers' buffers when it shuts them down.

NOTE (torch internals relied on): `_MultiProcessingDataLoaderIter._shutdown_workers`
(torch 2.6-2.13); `_BaseDataLoaderIter.__next__`.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from coordl.buffers import LENDER


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
            batch = super().__next__()  # pyright: ignore[reportAttributeAccessIssue] (a mixin before torch's iterator)
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

    def __next__(self):
        try:
            return super().__next__()
        except StopIteration:
            raise
        except BaseException as e:  # a worker's error (torch's ExceptionWrapper.reraise), a dead worker...
            # torch's frames below this one hold the iterator (`self`), and reraise's frame holds the
            # exception (`exception`): a cycle exception -> traceback -> frame -> exception, so the
            # iterator and its worker processes outlived a dropped exception until the garbage
            # collector ran. Their locals are cleared (the lines stay in the traceback; the worker's
            # own traceback is in the message), so the workers shut down (torch's __del__) as soon
            # as the exception is dropped; the iterator stays usable, as torch's, meanwhile.
            if e.__traceback__ is not None:
                traceback.clear_frames(e.__traceback__.tb_next)
            raise

    def _shutdown_workers(self) -> None:
        super()._shutdown_workers()
        LENDER.sweep()  # the workers are gone: drop this process's handles of their buffers
