"""The profiler's storage: a dataset's items read by index, as its loader reads them, and what
drops them from the page cache before a cold measurement.

`ItemReads(dataset)` reads through a copy of the dataset bound with ``drop_page_cache=True``,
which is how coordl.DataLoader reads storage without filling the page cache: the dataset's own
`fetch` / `fetch_many` (coordl/datasets/base.py), so a WebDataset reads tar members (a batch's
neighbours coalesced), an ImageFolder at a URL its objects, a user's subclass its `read` /
`read_many`. Nothing here knows a file path of an item. What evicts items depends on where they
are (`kind`):

- ``"files"``: an ImageFolder or AudioFolder on local disk (``manifest.path(i)`` is a file):
  ``posix_fadvise(DONTNEED)`` on each item's file.
- ``"tar shards"``: a WebDataset on local disk: on each whole shard holding one of the items
  (a member's first and last pages are shared with its neighbours, and DONTNEED on the member's
  byte range keeps partial pages).
- ``"object storage"``: a dataset or shards at a URL: no page cache here, every read is a request.
- ``"dataset read"``: anything else (a user's subclass): the profiler cannot drop its items, and
  `note` says so (the report carries it): reads called cold may come from memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from coordl.cache.storage import localfile, tarindex
from coordl.errors import SampleError


class ItemReads:
    """Items of `dataset` read from storage by index; `evict(items)` before a cold read."""

    def __init__(self, dataset: Any) -> None:
        self.ds = dataset.bind(drop_page_cache=True)  # uncounted, uncached; the user's object is untouched
        self.kind, self._evict = _eviction(dataset)
        self.cold = self.kind != "dataset read"  # does a read after evict() go to storage?
        self.note = None if self.cold else (
            f"{type(dataset).__name__} is neither files on local disk, tar shards nor object storage, so the "
            "profiler cannot drop its items from the page cache: reads it calls cold (the storage bandwidth, "
            "the read latency, the cold-storage runs) may have come from memory and be too fast, and the fetch "
            "stall too small. For cold numbers, profile right after dropping the page cache (as root: "
            "sync; echo 1 > /proc/sys/vm/drop_caches), or on a dataset larger than memory.")

    def read(self, i: int) -> bytes | None:
        """Item i's bytes from storage; None when it cannot be read (as the loader would skip it)."""
        try:
            return bytes(self.ds.fetch(int(i)))
        except SampleError:
            return None

    def read_many(self, items: Iterable[int]) -> dict[int, bytes]:
        """The bytes of the `items` that could be read, read together (the dataset's batch read)."""
        got, _errors = self.ds.fetch_many([int(i) for i in items])
        return {i: bytes(raw) for i, raw in got.items()}

    def evict(self, items: Iterable[int]) -> None:
        """Drop the items' pages from the page cache, where `kind` allows it (module doc)."""
        if self._evict is not None:
            self._evict([int(i) for i in items])

    def sizes(self) -> list[int]:
        """Bytes of every item: the manifest's sizes, or (no manifest) from reading every item once
        (0 for an item that cannot be read)."""
        sizes = getattr(getattr(self.ds, "manifest", None), "sizes", None)
        n = len(self.ds)
        if sizes is not None and len(sizes) == n:
            return [int(s) for s in sizes]
        out = [0] * n
        for start in range(0, n, 64):
            for i, raw in self.read_many(range(start, min(n, start + 64))).items():
                out[i] = len(raw)
        return out


def _eviction(ds: Any) -> tuple[str, Callable[[list[int]], None] | None]:
    """(kind, what evicts a list of items) for `ds` (module doc)."""
    index = getattr(ds, "index", None)
    if isinstance(index, tarindex.TarIndex):
        if index.remote is not None:
            return "object storage", None
        return "tar shards", lambda items: _drop([index.shards[int(index.shard[i])] for i in items])
    if getattr(ds, "objects", None) is not None:
        return "object storage", None
    path = getattr(getattr(ds, "manifest", None), "path", None)
    if callable(path) and len(ds) and isinstance(first := path(0), str) and os.path.isfile(first):
        return "files", lambda items: _drop([str(path(i)) for i in items])
    return "dataset read", None


def _drop(paths: list[str]) -> None:
    """posix_fadvise(DONTNEED) on each distinct file; one that is gone is skipped (reading it will
    fail and be reported by the read)."""
    for p in dict.fromkeys(paths):
        try:
            localfile.evict([p])
        except OSError:
            pass
