"""When an item's bytes enter the loader's cache: once its prep succeeded.

    with admitting(ds):              # a batch (or one item): reads are held, not cached
        raws = ds.fetch_many(items)  # storage reads -> offer(ds, read) -> held
        ... ds.prep(raw, i, epoch)   # raised or skipped: the item stays held ...
        admit(ds, i)                 # ... succeeded: offered to the cache now
                                     # leaving the block drops what is still held

A MinIO cache (and a partitioned one) admits the first items it is offered and never
evicts (cache/minio/cache.py), so an item offered before its prep would keep bytes that do not
decode (a 150 MB object that is not an image: 150 MiB of the cache) and be skipped from
the cache every epoch. Offering after prep keeps failures out; an item that failed is
read from storage again the next epoch and fails again (counted in ``errors_skipped``).

The DALI flow decodes a batch after its fetch returned, with batches in flight: its fetch
holds the reads in an `admitting` block and passes them on (`defer`); its settle offers the
kept items' bytes (`admit_deferred`) and drops the failed ones'. Outside both (the profiler's
byte reads) a read is offered at once, as before.

The held bytes live in the process that read them (a worker, the training process, a
prep worker of the daemon), for the length of one batch: the bytes prep is using anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def offer(ds: Any, read: dict[int, Any]) -> None:
    """Items just read from storage: held inside an `admitting` block, else offered to the cache."""
    if ds.cache is None or not read:
        return
    held = ds._held
    if held is not None:
        held.update(read)
    else:
        _put(ds, read)


def admit(ds: Any, i: int) -> None:
    """Item i's prep succeeded: offer its held bytes (if it was read from storage) to the cache."""
    held = ds._held
    if held:
        raw = held.pop(i, None)
        if raw is not None:
            _put(ds, {i: raw})


@contextlib.contextmanager
def admitting(ds: Any) -> Iterator[None]:
    """Hold the storage reads made inside until `admit`; drop what is left at the end. Nested
    blocks join the outermost one."""
    if ds.cache is None or ds._held is not None:
        yield
        return
    ds._held = {}
    try:
        yield
    finally:
        ds._held = None


def _put(ds: Any, read: dict[int, Any]) -> None:
    cache = ds.cache
    inserted = sum(1 for i, raw in read.items() if cache.put(i, raw))
    if inserted:
        ds.counters.add(cache_inserts=inserted)


def defer(ds: Any) -> None:
    """Inside an `admitting` block: keep what it holds for a later `admit_deferred` (the DALI
    flow: decoded after fetch returns). One entry per item read from storage, dropped there."""
    if ds._held:
        if ds._deferred is None:
            ds._deferred = {}
        ds._deferred.update(ds._held)
        ds._held.clear()


def admit_deferred(ds: Any, kept: list[int], failed: list[int]) -> None:
    """After DALI: the `kept` items' deferred bytes are offered to the cache, the `failed` ones'
    dropped."""
    deferred = ds._deferred
    if not deferred:
        return
    for i in failed:
        deferred.pop(i, None)
    read = {i: deferred.pop(i) for i in kept if i in deferred}
    if read:
        _put(ds, read)
