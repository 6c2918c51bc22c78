"""The readers of a dataset's item bytes: local files, objects under an fsspec URL, ranged reads of tar
members; the one batch read ahead per process, and this process's reader threads.

Both sources answer the same two calls, so the dataset's fetch loop (imagefolder.py `prep_rows`)
does not care which one it has:

    source.read_ahead(items) -> {item: future}     reads start now; future.result() is the bytes or
                                                   raises SampleError naming the file or URL
    source.read_many(items)  -> {item: bytes | SampleError}   the same, waited for

`ObjectFiles.read_ahead(items, counters)` also counts each object's GET requests and retries into a
loader's `storage_requests` / `storage_retries`.

`LocalFiles` reads on a few threads per process (a page-cache read blocks one thread). `ObjectFiles`
sends a batch's misses to the store at once (cache/storage/objstore.py `ObjectStore.submit_many`: concurrent
GETs, at most `max_in_flight` per process, retries with back-off, a timeout per request), so the
decoding of the items that arrived first overlaps the GETs still in flight.

`cache_hits` is the lookup in a MinIO cache done for a whole batch before its misses are read.

Read-ahead (ImageFolder's ``read_ahead``): a worker's batch carries the indices of the batch the same
worker gets next (`EpochBatch.ahead`, coordl/epochs/sampling.py). Right after starting its own misses,
the batch looks the next one up in the cache and starts its misses (`ObjectFiles.start_ahead`); the
next batch takes them (`ObjectFiles.take`) instead of looking up and GETting again. One batch at most
per process is held: whatever `take` is asked for that is not the batch expected (the epoch was left
early, a resume skipped batches) drops the held one, cancelling the GETs not yet done. An item read
ahead is counted once, by the batch that takes it: its GET requests and retries when it is taken
(before its future completes), its read when its bytes are used; GETs of a dropped read-ahead are not
counted (the server saw them). The cache lookup of a batch read ahead is counted when it is done.

`RangedReads` is the same held batch for WebDataset, whose batch's misses are ONE call (coalesced ranged
GETs, tarindex.TarIndex.read_many): that call runs on this process's reader threads, and the batch that
takes it counts its reads, bytes, requests and retries. Both hold their batch in an `_AheadSlot`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from coordl.errors import SampleError

from ..forkguard import ForkGuard
from . import localfile
from .objstore import ObjectStore

_READ_THREADS = 4
_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_FORK = ForkGuard(owned=False)


def reader_pool() -> concurrent.futures.ThreadPoolExecutor:
    """This process's reader threads (made on first use in each process: a pool inherited
    through fork has no threads)."""
    global _POOL
    if _POOL is None or _POOL_FORK.forked():
        _POOL = concurrent.futures.ThreadPoolExecutor(_READ_THREADS, "coordl-read")
        _POOL_FORK.reset()
    return _POOL


def _wait(futures: dict[int, concurrent.futures.Future]) -> dict[int, bytes | SampleError]:
    out: dict[int, bytes | SampleError] = {}
    for i, f in futures.items():
        try:
            out[i] = f.result()
        except SampleError as e:
            out[i] = e
    return out


def listed(manifest: Any, i: int) -> tuple[int, int] | None:
    """(size, mtime_ns) of local item i as listed, for `localfile.read_file`'s check (None: unknown)."""
    size, mtime = int(manifest.sizes[i]), int(manifest.mtimes[i])
    return (size, mtime) if size >= 0 and mtime != 0 else None


def _read_local(path: str, drop_page_cache: bool, expect: tuple[int, int] | None = None) -> bytes:
    try:
        return localfile.read_file(path, drop_page_cache=drop_page_cache, expect=expect)
    except OSError as e:
        raise SampleError(f"{path}: cannot read the file ({e.strerror or e}): check that it exists and is "
                          "readable, or pass on_error='skip'") from None


class LocalFiles:
    """Items of a manifest as files below its root."""

    def __init__(self, manifest: Any, drop_page_cache: bool = False) -> None:
        self.manifest, self.drop_page_cache = manifest, bool(drop_page_cache)

    def read_ahead(self, items: Iterable[int]) -> dict[int, concurrent.futures.Future]:
        pool, m = reader_pool(), self.manifest
        return {i: pool.submit(_read_local, m.path(i), self.drop_page_cache, listed(m, i)) for i in items}

    def read_many(self, items: Iterable[int]) -> dict[int, bytes | SampleError]:
        return _wait(self.read_ahead(items))


def _counting(counters: Any) -> Callable[[int], None]:
    def on_attempts(attempts: int) -> None:
        counters.add(storage_requests=attempts, storage_retries=attempts - 1)

    return on_attempts


class _Ahead:
    """The batch this process read ahead: its cache hits and the futures of its misses' GETs, with
    each GET's request count (filled on the store's thread before its future completes)."""

    def __init__(self, key: tuple[int, tuple[int, ...]], hits: dict[int, Any]) -> None:
        self.fork, self.key, self.hits = ForkGuard(), key, hits
        self.futures: dict[int, concurrent.futures.Future] = {}
        self.attempts: dict[int, int] = {}

    def drop(self) -> None:
        """Cancel the GETs not done (in the process that started them; a forked copy has no loop)."""
        if self.fork.owner():
            for f in self.futures.values():
                f.cancel()


def _key(epoch: int, items: Iterable[int]) -> tuple[int, tuple[int, ...]]:
    return int(epoch), tuple(int(i) for i in items)


class _AheadSlot:
    """The one batch read ahead in this process (an `_Ahead`), never pickled: futures stay in the
    process that started them."""

    _ahead: _Ahead | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ahead": None}

    def _hold(self, ahead: _Ahead) -> None:
        self.drop_ahead()
        self._ahead = ahead

    def _take(self, epoch: int, items: Iterable[int]) -> _Ahead | None:
        """The batch held if it is `items` of `epoch` (of this process), else None, dropping it."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if ahead.fork.forked() or ahead.key != _key(epoch, items):
            ahead.drop()
            return None
        return ahead

    def drop_ahead(self) -> None:
        """Drop the batch read ahead, if any (its reads not started are cancelled)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.drop()


def _counted_on_take(f: concurrent.futures.Future, i: int, ahead: _Ahead, counters: Any) -> concurrent.futures.Future:
    """A future of `f`'s result that first counts item i's GET requests and retries into `counters`."""
    out: concurrent.futures.Future = concurrent.futures.Future()

    def done(f: concurrent.futures.Future) -> None:
        n = ahead.attempts.get(i)
        if n is not None and counters is not None:
            counters.add(storage_requests=n, storage_retries=n - 1)
        if f.cancelled():
            out.cancel()
        elif f.exception() is not None:
            out.set_exception(f.exception())
        else:
            out.set_result(f.result())

    f.add_done_callback(done)
    return out


class ObjectFiles(_AheadSlot):
    """Items of a manifest as objects below its URL, read through `store` (an ObjectStore)."""

    def __init__(self, manifest: Any, store: ObjectStore) -> None:
        self.manifest, self.store = manifest, store

    def start_ahead(self, epoch: int, items: Iterable[int], hits: dict[int, Any]) -> None:
        """Start the GETs of the batch `items` of `epoch` but for its cache `hits` (looked up and
        counted by the caller), for the next `take`; drops the batch held before."""
        self.drop_ahead()
        ahead = _Ahead(_key(epoch, items), hits)
        for i in dict.fromkeys(ahead.key[1]):
            if i not in hits:
                def on_attempts(n: int, i: int = i) -> None:
                    ahead.attempts[i] = n
                ahead.futures[i] = self.store.submit_many([self.manifest.relpath(i)], on_attempts, self._sizes([i]),
                                                          self._etags([i]))[0]
        self._hold(ahead)

    def take(self, epoch: int, items: Sequence[int], counters: Any = None
             ) -> tuple[dict[int, Any], dict[int, concurrent.futures.Future]] | None:
        """(cache hits, {miss: future}) of the batch `items` of `epoch` if it is the one read ahead,
        else None (and the one held, if any, is dropped). Each future counts its item's requests
        into `counters` before it completes."""
        ahead = self._take(epoch, items)
        if ahead is None:
            return None
        return ahead.hits, {i: _counted_on_take(f, i, ahead, counters) for i, f in ahead.futures.items()}

    def url(self, i: int) -> str:
        """Item i's URL, credentials removed."""
        return self.store.url_of(self.manifest.relpath(i))

    def read_ahead(self, items: Iterable[int], counters: Any = None) -> dict[int, concurrent.futures.Future]:
        """As LocalFiles.read_ahead; with `counters` (a loader's), each object's GET requests are
        counted into ``storage_requests`` and its retries into ``storage_retries`` before its future
        completes (so a batch's counts are in stats() when the batch is)."""
        items = list(items)
        on_attempts = None if counters is None else _counting(counters)
        futures = self.store.submit_many([self.manifest.relpath(i) for i in items], on_attempts, self._sizes(items),
                                         self._etags(items))
        return dict(zip(items, futures))

    def _sizes(self, items: list[int]) -> list[int]:
        """The objects' sizes when listed (the manifest's; -1 where unknown), for one-call GETs."""
        return self.manifest.sizes[items].tolist()

    def _etags(self, items: list[int]) -> list[str | None] | None:
        """The objects' ETags when listed (the manifest's), each GET's If-Match: an object rewritten
        since is a SampleError saying it changed, never its new bytes (one snapshot per loader)."""
        etags = getattr(self.manifest, "etags", None)
        if etags is None:
            return None
        return [e.decode("utf-8", "surrogateescape") or None for e in etags[items].tolist()]

    def read_many(self, items: Iterable[int]) -> dict[int, bytes | SampleError]:
        return _wait(self.read_ahead(items))

    def stats(self) -> dict[str, int]:
        """This process's request counts (ObjectStore.stats)."""
        return self.store.stats()

    def __repr__(self) -> str:
        return f"ObjectFiles({self.store!r})"


def start_read(read: Callable[[list[int]], Any], items: list[int]) -> concurrent.futures.Future:
    """`read(items)` started on this process's reader threads."""
    return reader_pool().submit(read, items)


class RangedReads(_AheadSlot):
    """Read-ahead for a dataset whose batch's misses are read by ONE blocking call, `read(misses)`
    (WebDataset: TarIndex.read_many, a batch's neighbours in one ranged GET): the call of the batch
    read ahead runs on this process's reader threads; the batch that takes it gets its result (and
    counts it). A dropped batch's call is cancelled if it has not begun, else runs out uncounted."""

    def __init__(self, read: Callable[[list[int]], Any]) -> None:
        self.read = read

    def start_ahead(self, epoch: int, items: Iterable[int], hits: dict[int, Any]) -> None:
        """Start reading the batch `items` of `epoch` but for its cache `hits` (looked up and counted
        by the caller), for the next `take`; drops the batch held before."""
        self.drop_ahead()
        ahead = _Ahead(_key(epoch, items), hits)
        misses = [i for i in dict.fromkeys(ahead.key[1]) if i not in hits]
        if misses:
            ahead.futures[-1] = start_read(self.read, misses)
        self._hold(ahead)

    def take(self, epoch: int, items: Sequence[int]) -> tuple[dict[int, Any], concurrent.futures.Future | None] | None:
        """(cache hits, the future of `read(misses)` or None when all hit) of the batch `items` of
        `epoch` if it is the one read ahead, else None (and the one held, if any, is dropped)."""
        ahead = self._take(epoch, items)
        return None if ahead is None else (ahead.hits, ahead.futures.get(-1))
