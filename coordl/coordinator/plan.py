"""The coordinator's plan: pure functions of (items, batch size, seed, epoch).

Batches are numbered globally: batch ``g`` is batch ``g % batches_per_epoch``
of epoch ``g // batches_per_epoch``. The order of epoch ``e`` is
`coordl.epochs.sampling.epoch_order` (PCG64 seeded from (seed, e)), the same
function a local `coordl.DataLoader` over a coordl dataset uses with
``shuffle=True`` and no user generator or sampler; an item's augmentation
comes from `coordl.pipelines.crop.item_rng` (a `random.Random` seeded with
(seed, e, item)). So every process that holds a `Plan` (the daemon, its prep
workers, a test, a local loader) computes the same batches without talking
to the others.

Epochs are counted per job. A job that attaches starts at an epoch boundary,
so its epochs are whole: its first epoch is the earliest one whose batches
are all still available, i.e. still in the ring or not yet prepared
(`join_epoch`), and with ``epochs=E`` it gets E epochs from there
(`end_batch`), however late it came. A job that attaches while the others are
in the middle of epoch e therefore starts with epoch e + 1 (its first batch
comes when that epoch's first batch is prepared, at most K batches after the
slowest job's); a job that attaches to an idle daemon, or while the ring
still holds the first batch of an epoch, starts with that epoch. Jobs
launched together all start with the same epoch because the daemon hands out
no batch while they are still arriving (the join window, scheduler.py).

A job resumed from a checkpoint (client.py `load_state_dict`) is the one
exception: it continues mid-epoch at global batch
``first_batch(epoch) + batches`` and keeps its own first epoch, so
``end_batch(start_epoch)`` is where its epochs end; a batch of it that has
left the ring is prepared again (scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coordl.epochs.sampling import epoch_order
from coordl.errors import ConfigError


@dataclass(frozen=True)
class Plan:
    items: int                 # dataset length N
    batch_size: int            # B: items per batch (the last batch of an epoch may be shorter)
    seed: int = 0              # order and augmentation seed
    shuffle: bool = True       # False: every epoch in dataset order
    drop_last: bool = False    # True: drop an epoch's last, short batch
    epochs: int | None = None  # epochs each job gets; None: as many as it iterates

    def __post_init__(self) -> None:
        for name, low in (("items", 1), ("batch_size", 1)):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= low):
                raise ConfigError(f"{name}={value!r} must be an int >= {low}")
        if self.drop_last and self.items < self.batch_size:
            raise ConfigError(f"drop_last with batch_size={self.batch_size} > {self.items} items "
                              "leaves no batch: pass a smaller batch size or drop_last=False")
        if self.epochs is not None and not (isinstance(self.epochs, int) and self.epochs >= 1):  # pyright: ignore[reportUnnecessaryIsInstance] (user input)
            raise ConfigError(f"epochs={self.epochs!r} must be an int >= 1, or None for no limit")

    @property
    def batches_per_epoch(self) -> int:
        n, b = self.items, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def order(self, epoch: int) -> np.ndarray:
        """The item order of `epoch`: an int64 permutation of range(items) (read-only)."""
        return epoch_order(self.items, self.seed, epoch, self.shuffle)

    def epoch_of(self, g: int) -> int:
        return g // self.batches_per_epoch

    def batch(self, g: int) -> np.ndarray:
        """The item indices of global batch `g`, in order."""
        epoch, b = divmod(g, self.batches_per_epoch)
        lo = b * self.batch_size
        return self.order(epoch)[lo:lo + self.batch_size]

    def batch_len(self, g: int) -> int:
        b = g % self.batches_per_epoch
        return min(self.batch_size, self.items - b * self.batch_size)

    def first_batch(self, epoch: int) -> int:
        return epoch * self.batches_per_epoch

    def join_epoch(self, low: int) -> int:
        """The epoch a job attaching now starts with, given `low`: every batch from `low` on is
        still available to it (in the ring, or not prepared yet)."""
        return -(-low // self.batches_per_epoch)

    def end_batch(self, start_epoch: int) -> int | None:
        """The first batch after the epochs of a job that starts with `start_epoch` (None: no end)."""
        return None if self.epochs is None else self.first_batch(start_epoch + self.epochs)
