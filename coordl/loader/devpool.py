"""A fixed pool of device buffers that `DataLoader(device=...)` batches are views of (coordl/loader/devprep.py).

Each batch's images are the first rows of one buffer, (rows, 3, H, W) of the output dtype,
channels_last. The pool keeps one handle per buffer (its `UntypedStorage`), as coordl/buffers.py's
`Lender` does for worker buffers, and reuses a buffer only once nothing else in this process
refers to it: the storage's use count is 1 (no tensor, view, saved-for-backward tensor or batch
prepared ahead uses it). A batch the user keeps (a list of batches, gradient accumulation) keeps
its buffer; when every buffer is in use, the batch gets a fresh tensor from torch's allocator,
counted in ``stats()["gpu_buffer_misses"]``: memory is bounded by `slots` buffers plus what the
user keeps. A free buffer too small for the batch (a bigger batch, another size) is replaced.

On CUDA the caller orders the reuse (devprep.py): the side stream that writes a buffer first waits
for the user's stream, so a step queued on a batch before the user dropped it has read it.
"""

from __future__ import annotations

import torch

from coordl.buffers import use_count


class DevicePool:
    """`slots` reusable output buffers on `device` (made on first use; 0: every batch a new tensor)."""

    def __init__(self, slots: int, device: str | torch.device, dtype: torch.dtype) -> None:
        self.slots, self.device, self.dtype = slots, torch.device(device), dtype
        self._buffers: list[torch.UntypedStorage] = []

    def take(self, rows: int, hw: tuple[int, int]) -> tuple[torch.Tensor | None, bool]:
        """(a channels_last (rows, 3, H, W) tensor to prepare a batch into, whether it was a miss:
        every buffer in use, a fresh tensor); (None, False) for a pool of 0 slots."""
        if not self.slots:
            return None, False
        nbytes = rows * 3 * hw[0] * hw[1] * self.dtype.itemsize
        for n, buf in enumerate(self._buffers):
            if use_count(buf) == 1:
                if buf.nbytes() < nbytes:
                    self._buffers[n] = buf = self._new(rows, hw)
                return self._view(buf, rows, hw), False
        if len(self._buffers) < self.slots:
            self._buffers.append(self._new(rows, hw))
            return self._view(self._buffers[-1], rows, hw), False
        return self._view(self._new(rows, hw), rows, hw), True

    def _new(self, rows: int, hw: tuple[int, int]) -> torch.UntypedStorage:
        return torch.empty((rows, 3, *hw), dtype=self.dtype, device=self.device).untyped_storage()

    def _view(self, buf: torch.UntypedStorage, rows: int, hw: tuple[int, int]) -> torch.Tensor:
        h, w = hw
        return torch.empty(0, dtype=self.dtype, device=self.device).set_(  # pyright: ignore[reportCallIssue]
            buf, 0, (rows, 3, h, w), (3 * h * w, 1, 3 * w, 3))
