"""coordl: a data loader for PyTorch that removes data stalls.

    import coordl
    ds = coordl.ImageFolder("/data/imagenet/train", transform="train")
    loader = coordl.DataLoader(ds, batch_size=256, shuffle=True, num_workers=8)

Attributes are imported when first used (PEP 562), so the command line's
cache, cleanup and status commands start without importing torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from ._version import __version__
from .errors import CacheError, ConfigError, CoordinatorError, CoordlError, DatasetError, SampleError

#: public name -> module that defines it
_LAZY = {
    "DataLoader": ".loader.dataloader", "collate": ".batch", "loader_stats": ".loader.dataloader",
    "ImageFolder": ".datasets.imagefolder", "PreparedBatch": ".batch",
    "CoordlDataset": ".datasets.base", "AudioFolder": ".datasets.audio",
    "WebDataset": ".datasets.webdataset",
    "MinIOCache": ".datasets.caching", "PartitionedCache": ".loader.partitioned",
    "profile": ".profiler", "merge_states": ".loader.elastic",
    "ElasticResume": ".loader.lightning",  # imports lightning: only when used
}

__all__ = [
    "DataLoader", "ImageFolder", "AudioFolder", "CoordlDataset", "MinIOCache", "PartitionedCache", "PreparedBatch",
    "WebDataset", "collate", "loader_stats", "merge_states", "profile", "__version__",
    "CoordlError", "ConfigError", "DatasetError", "SampleError", "CacheError", "CoordinatorError",
]


def __getattr__(name: str):  # PEP 562
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coordl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if "torch" in sys.modules:
    # torch is loaded already (a training script): define DataLoader now, so that frameworks
    # that patch every DataLoader subclass when training starts (Lightning's re-instantiation
    # of loaders with an injected sampler) see ours; the CLI, which never imports torch, stays fast
    from coordl.loader.dataloader import DataLoader  # noqa: E402,F401

if TYPE_CHECKING:
    from coordl.datasets.audio import AudioFolder
    from coordl.datasets.base import CoordlDataset
    from coordl.datasets.caching import MinIOCache
    from coordl.datasets.imagefolder import ImageFolder, PreparedBatch
    from coordl.datasets.webdataset import WebDataset
    from coordl.loader.dataloader import DataLoader, collate, loader_stats
    from coordl.loader.elastic import merge_states
    from coordl.loader.partitioned import PartitionedCache

    from .profiler import profile
