"""A user's coordl.CoordlDataset of float32 vectors, for `coordl serve --dataset vectors:Vectors`
(tests/coordl/coordinator/test_serve_audio.py; the daemon finds it on PYTHONPATH).

Item i's bytes are 8 little-endian bytes of i ("storage"); prep turns them into a float32 vector of
`length` drawn from the item's generator (seed, epoch, i), label i % 3. `bad_item` returns a vector of
another length there (a sample the ring cannot hold)."""

from __future__ import annotations

import numpy as np
import torch

import coordl


class Vectors(coordl.CoordlDataset):
    def __init__(self, items: int = 22, length: int = 4, bad_item: int = -1, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self.items, self.length, self.bad_item = items, length, bad_item

    def __len__(self) -> int:
        return self.items

    @property
    def fingerprint(self) -> str:
        return f"vectors-{self.items}"

    def read(self, i: int) -> bytes:
        return int(i).to_bytes(8, "little")

    def prep(self, raw, i: int, epoch: int | None = None):
        n = self.length + (1 if i == self.bad_item else 0)
        base = float(int.from_bytes(bytes(raw), "little"))
        vec = base + self.np_rng(i, epoch).standard_normal(n).astype(np.float32)
        return torch.from_numpy(vec.astype(np.float32)), i % 3
