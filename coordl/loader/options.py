"""`LoaderOptions`: the arguments coordl.DataLoader takes beyond torch's, validated once.

    opts = LoaderOptions(cache="8GiB", rank=0, world_size=2)   # ConfigError naming a bad one
    opts.check_dataset(dataset)                                 # what needs a coordl dataset

Frozen, so a loader's options are what it was built with; `DataLoader.__init__`
makes one and only wires (coordl/loader/dataloader.py). A framework that
re-creates the loader (Lightning, Accelerate) passes the same arguments again
and gets equal options. What each option means: the DataLoader's docstring.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

import torch

from coordl import names
from coordl.buffers import TSO_MACHINES, check_platform
from coordl.epochs.sampling import check_rank
from coordl.errors import ConfigError


@dataclass(frozen=True)
class LoaderOptions:
    cache: Any = None                    # "8GiB", a MinIOCache or a PartitionedCache (coordl datasets)
    drop_page_cache: bool | None = None  # None: on when there is a cache
    coordinator: str | os.PathLike | None = None  # "unix:///path.sock" of a `coordl serve` daemon
    reuse_buffers: bool | None = None    # None: on where the CPU keeps stores in order (x86-64)
    rank: int | None = None              # None: torch.distributed's when used, else 0
    world_size: int | None = None        # None: torch.distributed's when used, else 1
    backend: str = "cpu"                 # names.BACKENDS
    dali_device: str = "cpu"             # names.DALI_DEVICES (with backend="dali")

    def __post_init__(self) -> None:
        if self.backend not in names.BACKENDS:
            raise ConfigError(f"backend={self.backend!r} is not known: use 'cpu' (default) or 'dali'")
        if self.dali_device not in names.DALI_DEVICES:
            raise ConfigError(f"dali_device={self.dali_device!r} must be 'cpu' or 'gpu' (DALI's mixed decode)")
        for name in ("drop_page_cache", "reuse_buffers"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{name}={value!r} must be True, False or None (the default)")
        if self.reuse_buffers:
            check_platform()
        if self.ranks is not None:  # refuse bad values now (torch.distributed's are read when used)
            default_ranks(self.rank, self.world_size)
        if self.coordinator is not None and not isinstance(self.coordinator, (str, os.PathLike)):
            raise ConfigError(f"coordinator={self.coordinator!r} must be the daemon's address, e.g. "
                              "'unix:///run/user/1000/coordl.sock'")
        if self.backend == "dali" and self.coordinator is not None:
            raise ConfigError("backend='dali' with coordinator=: the daemon prepares the batches; choose "
                              "its backend with `coordl serve --backend dali` and drop backend= here")

    @property
    def ranks(self) -> tuple[int | None, int | None] | None:
        """(rank, world_size) as given; None when neither was (torch.distributed's, read when used)."""
        return None if self.rank is None and self.world_size is None else (self.rank, self.world_size)

    @property
    def buffers_reused(self) -> bool:
        """Do workers reuse batch buffers (``reuse_buffers``, its default resolved)?"""
        if self.reuse_buffers is None:
            return platform.machine().lower() in TSO_MACHINES
        return self.reuse_buffers

    @property
    def binds_anew(self) -> bool:
        """Does a loader over an already bound dataset bind it again (a cache argument given),
        rather than keep its counters and cache (a framework re-creating the loader)?"""
        return self.cache is not None or self.drop_page_cache is not None

    def resolved_ranks(self) -> tuple[int, int]:
        """(rank, world_size): as given, else torch.distributed's (read now), else (0, 1)."""
        return default_ranks(self.rank, self.world_size)

    def check_dataset(self, dataset: Any, coordl_ds: bool) -> None:
        """Refuse what needs a coordl dataset (`coordl_ds`: is `dataset` one) when it is not."""
        if self.backend == "dali":
            if not coordl_ds:
                raise ConfigError(f"backend='dali' needs a coordl dataset (e.g. coordl.ImageFolder with "
                                  f"transform='train' or 'val'), not {type(dataset).__name__}")
            from coordl.loader.dali import require_dali
            require_dali()
        if not coordl_ds and self.binds_anew:
            raise ConfigError(f"cache= and drop_page_cache= need a coordl dataset (e.g. coordl.ImageFolder), "
                              f"not {type(dataset).__name__}: leave them unset")


def default_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed's (read now), else (0, 1); ConfigError if bad."""
    dist = torch.distributed
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() and world_size > 1 else 0
    check_rank(rank, world_size)
    return rank, world_size
