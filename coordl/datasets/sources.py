"""Where a dataset's item bytes come from: local files or objects under an fsspec URL.

Both sources answer the same two calls, so the dataset's fetch loop (imagefolder.py `prep_rows`)
does not care which one it has:

    source.read_ahead(items) -> {item: future}     reads start now; future.result() is the bytes or
                                                   raises SampleError naming the file or URL
    source.read_many(items)  -> {item: bytes | SampleError}   the same, waited for

`ObjectFiles.read_ahead(items, counters)` also counts each object's GET requests and retries into a
loader's `storage_requests` / `storage_retries`.

`LocalFiles` reads on a few threads per process (a page-cache read blocks one thread). `ObjectFiles`
sends a batch's misses to the store at once (cache/objstore.py `ObjectStore.submit_many`: concurrent
GETs, at most `max_in_flight` per process, retries with back-off, a timeout per request), so the
decoding of the items that arrived first overlaps the GETs still in flight.

`cache_hits` is the lookup in a MinIO cache done for a whole batch before its misses are read.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

from coordl.cache import storage
from coordl.cache.objstore import ObjectStore
from coordl.errors import SampleError

_READ_THREADS = 4
_POOL: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """This process's reader threads (made on first use in each process: a pool inherited
    through fork has no threads)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), concurrent.futures.ThreadPoolExecutor(_READ_THREADS, "coordl-read"))
    return _POOL[1]


def _wait(futures: dict[int, concurrent.futures.Future]) -> dict[int, bytes | SampleError]:
    out: dict[int, bytes | SampleError] = {}
    for i, f in futures.items():
        try:
            out[i] = f.result()
        except SampleError as e:
            out[i] = e
    return out


def _read_local(path: str, drop_page_cache: bool) -> bytes:
    try:
        return storage.read_file(path, drop_page_cache=drop_page_cache)
    except OSError as e:
        raise SampleError(f"{path}: cannot read the file ({e.strerror or e}): check that it exists and is "
                          "readable, or pass on_error='skip'") from None


class LocalFiles:
    """Items of a manifest as files below its root."""

    def __init__(self, manifest: Any, drop_page_cache: bool = False) -> None:
        self.manifest, self.drop_page_cache = manifest, bool(drop_page_cache)

    def read_ahead(self, items: Iterable[int]) -> dict[int, concurrent.futures.Future]:
        pool, m = _pool(), self.manifest
        return {i: pool.submit(_read_local, m.path(i), self.drop_page_cache) for i in items}

    def read_many(self, items: Iterable[int]) -> dict[int, bytes | SampleError]:
        return _wait(self.read_ahead(items))


def _counting(counters: Any) -> Callable[[int], None]:
    def on_attempts(attempts: int) -> None:
        counters.add(storage_requests=attempts, storage_retries=attempts - 1)

    return on_attempts


class ObjectFiles:
    """Items of a manifest as objects below its URL, read through `store` (an ObjectStore)."""

    def __init__(self, manifest: Any, store: ObjectStore) -> None:
        self.manifest, self.store = manifest, store

    def url(self, i: int) -> str:
        """Item i's URL, credentials removed."""
        return self.store.url_of(self.manifest.relpath(i))

    def read_ahead(self, items: Iterable[int], counters: Any = None) -> dict[int, concurrent.futures.Future]:
        """As LocalFiles.read_ahead; with `counters` (a loader's), each object's GET requests are
        counted into ``storage_requests`` and its retries into ``storage_retries`` before its future
        completes (so a batch's counts are in stats() when the batch is)."""
        items = list(items)
        on_attempts = None if counters is None else _counting(counters)
        futures = self.store.submit_many([self.manifest.relpath(i) for i in items], on_attempts)
        return dict(zip(items, futures))

    def read_many(self, items: Iterable[int]) -> dict[int, bytes | SampleError]:
        return _wait(self.read_ahead(items))

    def stats(self) -> dict[str, int]:
        """This process's request counts (ObjectStore.stats)."""
        return self.store.stats()

    def __repr__(self) -> str:
        return f"ObjectFiles({self.store!r})"


def is_url(root: object) -> TypeGuard[str]:
    """Is `root` an fsspec URL (``scheme://...``, file:// aside) rather than a local path?"""
    from coordl.manifest import objects

    return objects.is_url(root)


def open_source(url: str, extensions: Any, is_valid_file: Any, allow_empty: bool, rescan: bool,
                manifest_cache: Any, storage_options: dict | None, max_in_flight: int,
                fetch_client: str | None = None) -> tuple[Any, ObjectFiles]:
    """(the manifest, an ObjectFiles) of the ImageFolder at `url` (coordl/manifest/objects.py)."""
    from coordl.errors import ConfigError
    from coordl.manifest import objects
    from coordl.manifest.build import IMG_EXTENSIONS

    if is_valid_file is not None:
        raise ConfigError(f"is_valid_file is not supported for a dataset at a URL ({url.split('://')[0]}://...): "
                          "pass extensions=(...) to choose the objects")
    manifest, store = objects.scan_url(url, extensions or IMG_EXTENSIONS, allow_empty, storage_options=storage_options,
                                       max_in_flight=max_in_flight, rescan=rescan, manifest_cache=manifest_cache,
                                       fetch_client=fetch_client)
    return manifest, ObjectFiles(manifest, store)


def parse_storage_options(text: str | None, flag: str = "--storage-options") -> dict | None:
    """A command line's `--storage-options JSON` as a dict (None when not given). Without it, s3://
    reads the AWS_* environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) as s3fs does.
    The value is never echoed back: it may hold a secret."""
    import json

    from coordl.errors import ConfigError

    if text is None or text == "":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} is not JSON ({e.msg} at character {e.pos}): pass an object such as "
                          "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}' (credentials are better left to "
                          "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object (keys such as endpoint_url, anon), not a "
                          f"{type(value).__name__}")
    return value

