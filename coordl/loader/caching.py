"""Glue between `coordl.DataLoader` and the MinIO cache (`coordl.cache.minio`).

    coordl.DataLoader(ds, cache="8GiB")                 # node-wide, found by ds.fingerprint
    coordl.DataLoader(ds, cache=coordl.MinIOCache("8GiB", directory="/dev/shm"))
"""

from __future__ import annotations

import re
from typing import Any

from coordl.cache import minio, shm
from coordl.errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(value: Any, param: str = "cache") -> int:
    """Bytes from an int or a size string: '8GiB', '8G' (powers of 1024), '8GB' (powers of 1000)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(f"{param}={value!r} must be a positive number of bytes")
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f"{param}={value!r} is not a size: pass bytes as an int, or a string "
                          "such as '512MiB', '8GiB' or '8GB'")
    number, prefix, binary, b = m.groups()
    unit = _UNITS[prefix.lower() + ("b" if b and not binary and prefix else "")]
    size = int(float(number) * unit)
    if size <= 0:
        raise ConfigError(f"{param}={value!r} must be more than 0 bytes")
    return size


class MinIOCache(minio.MinIOCache):
    """A node-wide MinIO cache; `capacity` in bytes or a size string ('8GiB').

    See `coordl.cache.minio.MinIOCache`; ``coordl.DataLoader(ds, cache=...)``
    opens it for the dataset. `drop()` removes it from the node; otherwise it
    outlives the loader, and the next process that opens the same dataset
    attaches to it and hits at once.
    """

    def __init__(self, capacity: int | str, *, directory: str = shm.SHM_DIR,
                 name: str | None = None) -> None:
        super().__init__(parse_size(capacity, "capacity"), directory=directory, name=name)


def cache_for(dataset: Any, cache: Any) -> Any:
    """Open (attach to or create) the cache of `dataset` on this node.

    `cache` is a size (a node-wide MinIO cache of that capacity, at most the dataset's bytes),
    a `MinIOCache` (capped the same way), or any cache with the same
    `open(fingerprint, items, label=)` (a `coordl.PartitionedCache`). A MinIO cache of the
    dataset that exists with another capacity is replaced when no process uses it, else
    `CacheError` names both sizes (see `coordl.cache.minio`, NOTE [capacity]).
    """
    fingerprint = getattr(dataset, "fingerprint", None)
    if not isinstance(fingerprint, str):
        raise ConfigError(f"cache= needs a dataset with a `fingerprint` (e.g. coordl.ImageFolder); "
                          f"{type(dataset).__name__} has none: pass cache=None")
    if isinstance(cache, (int, str)) and not isinstance(cache, bool):
        cache = MinIOCache(parse_size(cache, "cache"))
    elif not callable(getattr(cache, "open", None)):
        raise ConfigError(f"cache={cache!r} is not a cache: pass a size such as '8GiB', a "
                          "coordl.MinIOCache or a coordl.PartitionedCache")
    label = str(getattr(dataset, "root", ""))
    if isinstance(cache, minio.MinIOCache):  # capped to what the dataset can use (NOTE [capacity])
        return cache.open(fingerprint, len(dataset), label=label, dataset_bytes=dataset_bytes(dataset))
    return cache.open(fingerprint, len(dataset), label=label)


def dataset_bytes(dataset: Any) -> int | None:
    """The sum of the items' sizes from the dataset's manifest (None: it has none)."""
    total = getattr(getattr(dataset, "manifest", None), "total_bytes", None)
    return total if isinstance(total, int) and not isinstance(total, bool) else None
