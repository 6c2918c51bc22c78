"""The epoch plan shared by every part of coordl: pure functions of (seed, epoch).

The order of an epoch is a permutation of the dataset that depends only on
(items, seed, epoch) (`epoch_order`); a rank's share of it is a strided slice
(`rank_share`) padded or truncated exactly as torch's `DistributedSampler`
does. A local `coordl.DataLoader` over a coordl dataset, the coordinator
daemon (coordinator/plan.py), resume and partitioned caching all call these
two functions, so they agree on every batch without talking to each other.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from coordl.errors import ConfigError

# The order's SeedSequence spawn key. Nothing else draws from a SeedSequence of (seed, epoch)
# (items' augmentation streams are random.Random, pipelines/crop.py item_rng); the key only
# fixes which permutation a (seed, epoch) gives, so changing it changes every epoch's order.
_ORDER_KEY = (0x0DE5,)


def epoch_order(items: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The item order of `epoch`: a read-only int64 permutation of range(items)."""
    return _order(int(items), int(seed), bool(shuffle), int(epoch))


@functools.lru_cache(maxsize=4)
def _order(items: int, seed: int, shuffle: bool, epoch: int) -> np.ndarray:
    if shuffle:
        seq = np.random.SeedSequence((seed, epoch), spawn_key=_ORDER_KEY)
        order = np.random.Generator(np.random.PCG64(seq)).permutation(items)
    else:
        order = np.arange(items, dtype=np.int64)
    order.flags.writeable = False
    return order


def share_size(items: int, world_size: int, drop_last: bool = False) -> int:
    """Items per rank, as `DistributedSampler.num_samples`."""
    if drop_last and items % world_size:
        return items // world_size
    return -(-items // world_size)


def rank_share(order: np.ndarray, rank: int, world_size: int, drop_last: bool = False) -> np.ndarray:
    """Rank `rank`'s items of an epoch `order`, as `DistributedSampler` splits its own order:
    pad by repeating the order's head (or, with `drop_last`, cut its tail) to a multiple of
    `world_size`, then take every `world_size`-th item starting at `rank`."""
    check_rank(rank, world_size)
    if world_size == 1:
        return order
    n = share_size(len(order), world_size, drop_last)
    total = n * world_size
    if total <= len(order):
        full = order[:total]
    else:
        pad = total - len(order)
        full = np.concatenate([order, np.resize(order, pad)]) if len(order) else order
    return full[rank:total:world_size]


class EpochBatch(list[int]):
    """A batch of dataset indices that carries the epoch it belongs to, and `ahead`: the indices of
    the batch the same worker process gets next in this epoch (None: the last of the epoch, or not
    known), which a dataset at a URL starts reading early (imagefolder.py `prep_rows`)."""

    def __init__(self, indices: Iterable[int], epoch: int, ahead: Iterable[int] | None = None) -> None:
        super().__init__(indices)
        self.epoch = epoch
        self.ahead = None if ahead is None else [int(i) for i in ahead]

    def __reduce__(self) -> tuple[type[EpochBatch], tuple[list[int], int, list[int] | None]]:
        return EpochBatch, ([int(i) for i in self], self.epoch, self.ahead)


def with_ahead(batches: Iterable[list[int]], stride: int) -> Iterator[tuple[list[int], list[int] | None]]:
    """(batch, the batch `stride` places after it, or None past the end) for each of `batches`.

    torch's multi-process iterator hands batch b of an epoch to worker b % num_workers (its
    round-robin, reset each epoch), so with stride=num_workers the second is the same worker's next
    batch; with one process (num_workers=0), stride=1. Holds `stride` batches back, never more."""
    window: collections.deque[list[int]] = collections.deque()
    for batch in batches:
        window.append(batch)
        if len(window) > stride:
            yield window.popleft(), batch
    while window:
        yield window.popleft(), None


class EpochIndex(int):
    """One dataset index that carries its epoch: what the plan samplers yield, so that a batch
    sampler of anyone's (Accelerate's BatchSamplerShard) passes the epoch on to persistent
    workers, which never see the dataset's `set_epoch` in the main process."""

    epoch: int

    def __new__(cls, index: int, epoch: int) -> EpochIndex:
        obj = super().__new__(cls, index)
        obj.epoch = epoch
        return obj

    def __reduce__(self) -> tuple[type[EpochIndex], tuple[int, int]]:
        return EpochIndex, (int(self), self.epoch)


def check_rank(rank: object, world_size: object) -> None:
    """ConfigError unless `world_size` is an int >= 1 and `rank` an int in [0, world_size):
    they come from the user, of any type."""
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ConfigError(f"world_size={world_size!r} must be an int >= 1 (the number of ranks)")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ConfigError(f"rank={rank!r} must be an int in [0, world_size={world_size}): "
                          "the index of this process among the ranks")


class RestOfEpoch(Protocol):
    """What `PlanSampler.rests` holds for an epoch resumed from another job's states
    (coordl/loader/elastic.py ResumePoint)."""

    @property
    def rest(self) -> np.ndarray | None:
        """The positions of the epoch's order still to read (None: all of it)."""
        ...

    @property
    def stages(self) -> Sequence[Mapping[str, Any]]:
        """What earlier jobs read of the epoch (a state's ``consumed``: elastic.py Stage)."""
        ...


class PlanSampler(torch.utils.data.Sampler[int]):
    """The sampler `coordl.DataLoader` gives a coordl dataset: this rank's share of
    `epoch_order(items, seed, epoch)`. Like `DistributedSampler`, the loader calls
    `set_epoch` before each epoch; unlike it, the same function serves one process,
    many ranks and the coordinator daemon."""

    def __init__(self, items: int, seed: int, shuffle: bool = True, rank: int = 0,
                 world_size: int = 1, drop_last: bool = False) -> None:
        check_rank(rank, world_size)
        self.items, self.seed, self.shuffle = int(items), int(seed), bool(shuffle)
        self.rank, self.world_size, self.drop_last = rank, world_size, bool(drop_last)
        self.epoch = 0
        # epoch -> its ResumePoint (coordl/loader/elastic.py: .rest, the positions of its order still
        # to read, and .stages): an epoch resumed from another job's states. Shared by
        # the loader's plan and rank samplers (the same dict object), set by load_state_dict.
        self.rests: dict[int, RestOfEpoch] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def order(self, epoch: int) -> np.ndarray:
        """The global order of `epoch` this sampler splits: the plan's, or of an epoch resumed
        from another job, the part of it that job had not read (`rests`)."""
        order = epoch_order(self.items, self.seed, epoch, self.shuffle)
        point = self.rests.get(epoch)
        return order if point is None or point.rest is None else order[point.rest]

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's items of `epoch` (default: the current one), in order."""
        order = self.order(self.epoch if epoch is None else epoch)
        return rank_share(order, self.rank, self.world_size, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch
        return (EpochIndex(i, epoch) for i in self.indices().tolist())

    def __len__(self) -> int:
        # a whole epoch's share, also in an epoch resumed from another job's states, as after any
        # resume: frameworks read len once and keep it for every epoch (Lightning, after iter())
        return share_size(self.items, self.world_size, self.drop_last)

    def __repr__(self) -> str:
        return (f"PlanSampler(items={self.items}, seed={self.seed}, shuffle={self.shuffle}, "
                f"rank={self.rank}, world_size={self.world_size}, drop_last={self.drop_last})")


class ShuffledPlanSampler(PlanSampler, torch.utils.data.RandomSampler):
    """A shuffled `PlanSampler` that frameworks recognise as shuffled: Lightning's
    `_is_dataloader_shuffled` and Accelerate look for a `RandomSampler`. Its order is the
    plan's; RandomSampler's attributes are there for code that reads them."""

    def __init__(self, items: int, seed: int, rank: int = 0, world_size: int = 1, drop_last: bool = False) -> None:
        PlanSampler.__init__(self, items, seed, True, rank, world_size, drop_last)
        self.data_source, self.replacement, self._num_samples, self.generator = range(items), False, None, None

    __iter__ = PlanSampler.__iter__
    __len__ = PlanSampler.__len__


def plan_sampler(items: int, seed: int, shuffle: bool) -> PlanSampler:
    """The whole-epoch sampler of the plan for one process."""
    return ShuffledPlanSampler(items, seed) if shuffle else PlanSampler(items, seed, False)
