"""Glue between `coordl.DataLoader` and the MinIO cache (`coordl.cache.minio.cache`): `cache_for`.

coordl.DataLoader(ds, cache="8GiB")                 # node-wide, found by ds.fingerprint
coordl.DataLoader(ds, cache=coordl.MinIOCache("8GiB", directory="/dev/shm"))
"""

from __future__ import annotations

from typing import Any

from coordl.cache.minio import MinIOCache
from coordl.cache.sizes import parse_size
from coordl.datasets.base import CoordlDataset, require_fingerprint
from coordl.errors import ConfigError

__all__ = ["MinIOCache", "cache_for", "dataset_bytes", "parse_size"]

#: ``coordl.MinIOCache`` is the cache's own class (coordl.cache.minio), which takes bytes or a size
#: string ('8GiB')


def cache_for(dataset: Any, cache: Any) -> Any:
    """Open (attach to or create) the cache of `dataset` on this node.

    `cache` is a size (a node-wide MinIO cache of that capacity, at most the dataset's bytes),
    a `MinIOCache` (capped the same way), or any cache with the same
    `open(fingerprint, items, label=)` (a `coordl.PartitionedCache`). A MinIO cache of the
    dataset that exists with another capacity is replaced when no process uses it, else
    `CacheError` names both sizes (see `coordl.cache.minio.cache`, NOTE [capacity]). A dataset
    that is no coordl dataset, or whose `fingerprint` is missing or malformed, is a ConfigError.
    """
    if not isinstance(dataset, CoordlDataset):
        raise ConfigError(f"cache= needs a coordl dataset (a coordl.CoordlDataset, e.g. coordl.ImageFolder); "
                          f"{type(dataset).__name__} is not one: pass cache=None")
    fingerprint = require_fingerprint(dataset, "cache=")  # the one check, the one message (datasets/base.py)
    if isinstance(cache, (int, str)) and not isinstance(cache, bool):
        cache = MinIOCache(parse_size(cache, "cache"))
    elif not callable(getattr(cache, "open", None)):
        raise ConfigError(f"cache={cache!r} is not a cache: pass a size such as '8GiB', a "
                          "coordl.MinIOCache or a coordl.PartitionedCache")
    label = str(getattr(dataset, "root", ""))
    if isinstance(cache, MinIOCache):  # capped to what the dataset can use (NOTE [capacity])
        return cache.open(fingerprint, len(dataset), label=label, dataset_bytes=dataset_bytes(dataset))
    opener: Any = getattr(cache, "open")  # noqa: B009 (any cache with open(fingerprint, items, label=): checked above)
    return opener(fingerprint, len(dataset), label=label)


def dataset_bytes(dataset: Any) -> int | None:
    """The sum of the items' sizes from the dataset's manifest (None: it has none)."""
    total = getattr(getattr(dataset, "manifest", None), "total_bytes", None)
    return total if isinstance(total, int) and not isinstance(total, bool) else None
