"""`coordl.WebDataset`: WebDataset-layout tar shards as a map-style dataset with item-level access.

    ds = coordl.WebDataset("/data/train-{000000..000146}.tar", transform="train")
    loader = coordl.DataLoader(ds, batch_size=256, shuffle=True, num_workers=8, cache="32GiB")

Samples are grouped by key (``key.jpg`` + ``key.cls``); an index of (shard, offset, size, label)
per sample is built once from the tar headers and persisted beside the manifests
(cache/storage/tarindex.py), so an item is one pread and the epoch order is coordl's exact
global shuffle (not webdataset's shuffle within a buffer over a shard order). Item i is the
i-th sample of the shards in the order the URLs give them (brace patterns expanded as
webdataset does), then in the order of the tar.

The image pipeline, batch buffers, on_error, caches, counters, resume and ranks are
ImageFolder's: this class is an ImageFolder whose bytes come from tar members. What differs:
a batch's misses are read together, items of one shard within `max_gap` bytes with one pread
(`storage_reads` counts preads, `storage_bytes` the bytes they read, gaps included), and a
bad sample's `SampleError` names the shard and the key.

Shards in a bucket (any fsspec URL, s3:// through s3fs; `storage_options` as ImageFolder's):

    ds = coordl.WebDataset("s3://bucket/prefix/train-{000000..000009}.tar",
                           storage_options={"endpoint_url": "http://127.0.0.1:9000"})

one ObjectStore at the shards' common folder lists them once (size, ETag); the index is built
from the tar headers (tarindex.build_remote_index: a shard up to 16 MiB with one GET of all of
it, a larger one by ranged GETs of 4 KiB from each header) and persisted keyed by the shards'
(URL, size, ETag); an item is a ranged GET, and a batch's items within `max_gap` bytes in one
shard are ONE ranged GET (ObjectStore.read_ranges: at most `max_in_flight` at once, retries).
A GET that fails (a deleted shard) is a SampleError naming the shard's URL and the key.
`storage_requests` / `storage_retries` count the ranged GETs' requests and retries, as ImageFolder's.
Read-ahead as ImageFolder's (`read_ahead`, cache/storage/readers.py `RangedReads`): while a worker
prepares a batch, the ranged GETs of the batch it gets next are in flight; the batch that takes them
counts their reads, bytes, requests and retries, so each item is still read and counted once per epoch
(a batch read ahead and dropped is never counted).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from coordl.cache.storage import readers, tarindex
from coordl.datasets import admission, sources
from coordl.datasets.base import cached
from coordl.datasets.imagefolder import ImageFolder, check_pipeline_args
from coordl.datasets.onerror import sample_error, skip_or_raise
from coordl.errors import ConfigError, DatasetError, SampleError, at_item
from coordl.manifest import store

IMAGE_EXT = ("jpg", "jpeg", "png", "webp")


def expand_urls(urls: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Shard paths from `urls` as webdataset reads them: a string may hold brace patterns
    (``train-{000000..000146}.tar``, ``{a,b}.tar``) and several patterns joined by ``::``;
    a list is expanded element by element."""
    try:
        from braceexpand import braceexpand
    except ImportError:
        raise ConfigError("coordl.WebDataset expands brace patterns with the braceexpand package, which "
                          "is not installed: pip install 'coordl[webdataset]' (or braceexpand)") from None

    if isinstance(urls, (str, os.PathLike)):
        urls = os.fspath(urls).split("::")
    out: list[str] = []
    for u in urls:
        out.extend(braceexpand(os.fspath(u)))
    return out


def _local(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def _remote_index(urls: list[str], storage_options: dict | None, max_in_flight: int, image_ext: Sequence[str],
                  label_ext: str, folder: str | None, threads: int, rebuild: bool,
                  fetch_client: str | None = None) -> tarindex.TarIndex:
    """The index of shards at object-storage URLs: one store at their common folder, one listing
    of it for the shards' sizes and ETags, then tarindex.build_remote_index."""
    from coordl.cache.storage.objstore import ObjectStore

    local = [u for u in urls if "://" not in u]
    schemes = sorted({u.split("://", 1)[0] for u in urls if "://" in u})
    if local or len(schemes) != 1:
        raise ConfigError(f"WebDataset: the shards mix object-storage URLs ({schemes[0]}://...) with "
                          f"{'local paths (' + repr(local[0]) + ')' if local else 'other schemes ' + str(schemes)}: "
                          "put all shards in one store, or all on local disk")
    dirs = [u.rsplit("/", 1)[0].split("/") for u in urls]
    common = dirs[0]
    for d in dirs[1:]:
        n = 0
        while n < min(len(common), len(d)) and common[n] == d[n]:
            n += 1
        common = common[:n]
    root = "/".join(common)
    if len(common) < 3 or not common[2]:  # [scheme:, '', bucket, ...]: no bucket in common
        raise ConfigError(f"WebDataset: the shard URLs ({urls[0]}, ...) are not in one bucket: read one bucket "
                          "per WebDataset")
    objects = ObjectStore.from_url(root, storage_options, max_in_flight=max_in_flight, fetch_client=fetch_client)
    keys = [u[len(root) + 1:] for u in urls]
    listed = {o.key: (o.size, o.etag) for o in objects.list()}
    missing = [objects.url_of(k) for k in keys if k not in listed]
    if missing:
        raise DatasetError(f"WebDataset: {len(missing)} of {len(urls)} shards are not in the store (first: "
                           f"{missing[0]!r}): check the URLs or the brace pattern")
    try:
        return tarindex.build_remote_index(objects, keys, [listed[k] for k in keys], image_ext, label_ext,
                                           folder, threads, rebuild)
    except SampleError as e:
        raise DatasetError(f"WebDataset: cannot index a shard: {e}") from None


def _tallied(read: Callable[..., tuple], items: list[int]) -> tuple:
    """`read(items)` (a TarIndex.read_many) with the requests and retries of its ranged GETs appended:
    (bytes, errors, reads, bytes read, requests, retries), for the batch that uses the result to count
    (so a batch read ahead and dropped is never counted). Local shards: 0 and 0."""
    tally = [0, 0]

    def on_attempts(n: int) -> None:  # on the store's thread, each call before read() returns
        tally[0] += n
        tally[1] += n - 1

    got = read(items, on_attempts=on_attempts)
    return (*got, tally[0], tally[1])


class _Manifest:
    """What coordl's other parts read of a dataset's manifest, over a tar index: the items' count,
    bytes (caps a MinIO cache), labels and sizes, and `path(i)` naming the shard and key."""

    def __init__(self, index: tarindex.TarIndex) -> None:
        self.index, self.labels, self.sizes = index, index.label, index.size
        self.fingerprint, self.total_bytes = index.fingerprint, index.total_bytes

    def __len__(self) -> int:
        return len(self.index)

    def path(self, i: int) -> str:
        return self.index.where(i)


class WebDataset(ImageFolder):
    """A map-style dataset over WebDataset tar shards, with ImageFolder's pipeline.

    Args:
        urls: shard paths: a string with brace patterns and ``::`` separators, or a list of them.
        transform, size, seed, on_error, target_transform: as `coordl.ImageFolder`.
        image_ext: member extensions that are the image, in order of preference.
        label_ext: the member extension whose text is the int label.
        index_cache: folder of persisted indexes (default: the manifest folder, see
            coordl/manifest/store.py); ``"off"`` builds the index at every start.
        reindex: build the index even if the persisted one matches the shards.
        index_threads: shards indexed at once.
        max_gap: two items of one batch and shard at most this many bytes apart are read by one pread
            (one ranged GET for shards in a bucket).
        storage_options: for shards at object-storage URLs (``s3://bucket/train-{000000..000009}.tar``):
            the fsspec options, as `coordl.ImageFolder` takes them (endpoint_url, key, secret, anon, ...).
        max_in_flight: GETs in flight at once per process, for shards in a bucket.
        fetch_client: for shards in ``s3://``: ``"auto"``, ``"obstore"`` or ``"s3fs"``, as
            `coordl.ImageFolder` takes it.
        read_ahead: for shards in a bucket: the ranged GETs of the batch a worker gets next start while
            it prepares the current one, as `coordl.ImageFolder` takes it (None: on with obstore, off
            with s3fs; at most one batch ahead per worker, never a cached item, each read counted once).
            No effect on local shards.
    """

    def __init__(
        self,
        urls: str | os.PathLike | Sequence[str | os.PathLike],
        transform: str | Callable | None = "train",
        size: int | tuple[int, int] = 224,
        seed: int = 0,
        on_error: str = "raise",
        image_ext: Sequence[str] = IMAGE_EXT,
        label_ext: str = "cls",
        target_transform: Callable | None = None,
        index_cache: str | None = None,
        reindex: bool = False,
        index_threads: int = 16,
        max_gap: int = tarindex.MAX_GAP,
        storage_options: dict | None = None,
        max_in_flight: int = 32,
        fetch_client: str | None = None,
        read_ahead: bool | None = None,
    ) -> None:
        size = check_pipeline_args(transform, size, on_error)
        read_ahead = sources.check_read_ahead(read_ahead)
        if isinstance(image_ext, str) or not image_ext:
            raise ConfigError(f"image_ext={image_ext!r} must be a non-empty sequence of extensions, "
                              "e.g. ('jpg', 'png')")
        shards = [_local(u) for u in expand_urls(urls)]
        if not shards:
            raise ConfigError(f"urls={urls!r} names no shard: pass a path or a brace pattern")
        if any(sources.is_url(p) for p in shards):
            self.index = _remote_index(shards, storage_options, max_in_flight, image_ext, label_ext,
                                       store.directory(index_cache), index_threads, reindex, fetch_client)
        else:
            missing = [p for p in shards if not os.path.isfile(p)]
            if missing:
                raise DatasetError(f"WebDataset: {len(missing)} of {len(shards)} shards are not files (first: "
                                   f"{missing[0]!r}): check the paths or the brace pattern in urls={urls!r}")
            try:
                self.index = tarindex.build_index(shards, image_ext, label_ext, store.directory(index_cache),
                                                  index_threads, rebuild=reindex)
            except OSError as e:
                raise DatasetError(f"WebDataset: cannot open the shard {e.filename!r} ({e.strerror or e}): "
                                   "check the path or brace pattern in urls") from None
        shards = list(self.index.shards)
        damaged = [(s, d) for s, d in zip(self.index.shards, self.index.damage) if d]
        for shard, why in damaged:
            msg = f"{shard}: the shard is damaged: {why}"
            if on_error == "raise":
                raise SampleError(msg + ": rewrite the shard, or pass on_error='skip' to use its "
                                  "readable samples")
            warnings.warn(msg + ": only the samples before the damage are used", stacklevel=2)
        if len(self.index) == 0 and on_error == "raise":
            raise DatasetError(f"WebDataset: no samples in {len(shards)} shard(s) ({shards[0]}...) with "
                               f"image_ext={tuple(image_ext)!r}: check the member names (key.jpg, key.cls)")
        self.damaged_shards = [s for s, _ in damaged]
        self.urls, self.shards, self.max_gap = urls, list(self.index.shards), int(max_gap)
        self.label_ext = label_ext.lower().lstrip(".")
        self.manifest = _Manifest(self.index)
        self.objects = None
        self.root = os.fspath(urls) if isinstance(urls, (str, os.PathLike)) else self.shards[0]
        self.transform, self.size, self.on_error, self.seed = transform, size, on_error, int(seed)
        self.target_transform, self.read_ahead = target_transform, read_ahead
        # the batch read ahead (shards in a bucket): its misses' coalesced ranged GETs, one call
        self.ranged = None if self.index.remote is None else readers.RangedReads(functools.partial(
            _tallied, functools.partial(self.index.read_many, drop_page_cache=False, max_gap=self.max_gap)))
        ok = self.index.label[self.index.label_state == tarindex.OK]
        self.classes = sorted(int(c) for c in np.unique(ok))
        self.class_to_idx = {str(c): c for c in self.classes}
        self.epoch = 0

    @property
    def samples(self) -> list[tuple[str, int]]:
        """("<shard>: sample <key>", class index) of every sample, as ImageFolder's ``samples``."""
        return [(self.index.where(i), int(self.index.label[i])) for i in range(len(self))]

    @property
    def targets(self) -> list[int]:
        """The class index of every sample, in item order."""
        return self.index.label.tolist()

    @property
    def object_store(self) -> Any:
        """The ObjectStore the shards are read from (its `stats()` count this process's GETs), or None
        for local shards."""
        return None if self.index.remote is None else self.index.remote[0]

    @property
    def fingerprint(self) -> str:
        """The shards' index fingerprint: changes whenever any shard changes (cache keys carry it)."""
        return self.index.fingerprint

    def __len__(self) -> int:
        return len(self.index)

    # -- bytes: the cache, then the shards, a batch's misses read together --
    def read(self, i: int) -> bytes:
        """Sample i's image bytes from its shard (uncounted, uncached: `fetch` does both); a
        `SampleError` names the shard and key."""
        data, errors, _reads, _nbytes = self.index.read_many([int(i)], self.drop_page_cache, self.max_gap)
        if i in errors:
            raise errors[i]
        return data[i]

    def read_many(self, items: list[int]) -> dict[int, bytes | Exception]:
        """Several samples' bytes, adjacent ones of a shard in one read (uncounted, uncached)."""
        data, errors, _reads, _nbytes = self.index.read_many([int(i) for i in items], self.drop_page_cache,
                                                             self.max_gap)
        return {**data, **errors}

    def _read(self, i: int, pending: Any = None) -> bytes:
        raws, errors = self._read_misses([i])
        if i in errors:
            raise errors[i]
        return raws[i]

    def _read_misses(self, items: list[int]) -> tuple[dict[int, bytes], dict[int, SampleError]]:
        read = functools.partial(self.index.read_many, drop_page_cache=self.drop_page_cache, max_gap=self.max_gap)
        return self._count_read(items, _tallied(read, items))

    def _count_read(self, items: list[int], read: tuple) -> tuple[dict[int, bytes], dict[int, SampleError]]:
        """A batch's `_tallied(index.read_many, items)` result counted and its bytes offered to the cache."""
        data, errors, reads, nbytes, requests, retries = read
        self.counters.add(storage_reads=reads, storage_bytes=nbytes, storage_requests=requests,
                          storage_retries=retries)
        admission.offer(self, {i: data[i] for i in items if i in data})  # cached once prepped
        return data, errors

    def fetch_many(self, items: Sequence[int], ahead: Sequence[int] | None = None
                   ) -> tuple[dict[int, Any], dict[int, SampleError]]:
        """(bytes per item, SampleError per item): hits from the cache, the misses from the shards
        with coalesced reads. With `ahead` (the items this process asks for next) and a
        partitioned cache, their MGETs go out before the misses are read (as ImageFolder's)."""
        items = [int(i) for i in dict.fromkeys(int(i) for i in items)]
        hits = cached(self.cache, items, self.counters)
        self._send_ahead(ahead)
        data, errors = self._read_misses([i for i in items if i not in hits])
        hits.update(data)
        return hits, errors

    def _fetch_batch(self, indices: Sequence[int], epoch: int) -> tuple[dict[int, Any], dict[int, SampleError]]:
        """`fetch_many(indices)`, taking the batch's reads if the last batch started them, and starting
        the reads of the batch this worker gets next (`EpochBatch.ahead`) before waiting for its own."""
        ranged = self.ranged
        ahead = getattr(indices, "ahead", None)
        if ranged is None or self.read_ahead is False:
            return self.fetch_many(indices, ahead)
        items = [int(i) for i in dict.fromkeys(int(i) for i in indices)]
        early = ranged.take(epoch, indices)
        pending: concurrent.futures.Future | None = None
        if early is not None:  # looked up and its misses' GETs started by the last batch
            hits, pending = early
        else:
            hits = cached(self.cache, items, self.counters)
        misses = [i for i in items if i not in hits]
        store = self.object_store
        if ahead and sources.reads_ahead(self.read_ahead, store):
            if pending is None and misses:  # its own GETs first, then the next batch's
                pending = readers.start_read(ranged.read, misses)
            ranged.start_ahead(epoch, ahead, cached(self.cache, ahead, self.counters))
        else:
            self._send_ahead(ahead)
        if pending is not None:
            data, errors = self._count_read(misses, pending.result())
        else:
            data, errors = self._read_misses(misses) if misses else ({}, {})
        hits.update(data)
        return hits, errors

    def _send_ahead(self, ahead: Sequence[int] | None) -> None:
        """A partitioned cache's MGETs of the batch this worker gets next (`EpochBatch.ahead`) go
        out now, for the next batch's lookup to read (cache/partitioned/cache.py `send_ahead`)."""
        if ahead and hasattr(self.cache, "send_ahead"):
            self.cache.send_ahead(ahead)

    # -- labels and messages name the shard and key --
    def _label(self, i: int) -> int:
        state = self.index.label_state[i]
        if state != tarindex.OK:
            what = "no label member" if state == tarindex.MISSING else "a label member that is not an int"
            raise at_item(SampleError(f"{self.index.where(i)} has {what} (.{self.label_ext}): add '<key>."
                              f"{self.label_ext}' holding the class number, or pass on_error='skip'"), i)
        return int(self.index.label[i])

    def _target(self, i: int):
        label = self._label(i)
        return label if self.target_transform is None else self.target_transform(label)

    def _sample_error(self, i: int, e: SampleError) -> SampleError:
        return at_item(sample_error(self.index.where(i), e, "replace the sample in its shard"), i)

    def prep_rows(self, indices: Sequence[int], epoch: int, images: np.ndarray, labels: np.ndarray,
                  ids: np.ndarray | None = None, kept: list[int] | None = None) -> int:
        """ImageFolder.prep_rows with the batch's bytes fetched first (coalesced reads, read ahead).
        A new epoch checks each local shard again at its next read (TarIndex.begin_epoch)."""
        self.index.begin_epoch(epoch)
        with admission.admitting(self):  # a read is cached once its prep succeeded
            raws, errors = self._fetch_batch(indices, epoch)
            row = 0
            for i in indices:
                i = int(i)
                try:
                    if i in errors:
                        raise errors[i]
                    label = self._label(i)
                    self.prep_into(raws[i], i, epoch, images[row])
                    admission.admit(self, i)  # its bytes, if just read, go to the cache now
                except SampleError as e:
                    skip_or_raise(self.on_error, self.counters, at_item(e, i))
                    continue
                except Exception as e:  # not the item's fault; a prep worker's report names the item
                    at_item(e, i)
                    raise
                labels[row] = label
                if ids is not None:
                    ids[row] = i
                if kept is not None:
                    kept.append(i)
                row += 1
        self.counters.add(samples=row)
        return row

    def __repr__(self) -> str:
        return (f"WebDataset(urls={self.urls!r}, shards={len(self.shards)}, items={len(self)}, "
                f"transform={self.transform!r}, size={self.size})")
