"""`coordl.ImageFolder`: torchvision's ImageFolder, split into fetch and prep.

    fetch(i) -> bytes                      the item's file: from the loader's cache (MinIO or
                                           partitioned) when it holds it, else from storage
    prep(raw, i, epoch) -> (image, label)  decode + augment only

`ds[i]` is `prep(fetch(i), i, ds.epoch)`. For transform "train" or "val",
`__getitems__` (what torch's DataLoader calls for a batch) writes each sample
straight into its row of one uint8 (B, H, W, 3) batch buffer, in shared
memory when it runs in a worker process (the batch reaches the training
process by file descriptor, with no pickling of pixels), and hands the batch
out as (B, 3, H, W) in channels_last memory format; for any other transform
it returns the list of samples, as torch's would.

An item's augmentation is a pure function of (seed, epoch, index), so batches
are identical whatever `num_workers` is. The epoch comes with each batch of
indices from `coordl.DataLoader` (`EpochBatch`, coordl/epochs/sampling.py), so
persistent workers need no message to learn it.

What the loader owns (counters, cache, batch buffers, a coordinator client)
is not the dataset's: `bind` gives the loader a copy that carries one
`Binding` (coordl/datasets/binding.py); the dataset you made has none.
"""
from __future__ import annotations

import concurrent.futures
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from coordl import names
from coordl.batch import EncodedBatch, PreparedBatch
from coordl.buffers import WorkerBuffers, new_shared
from coordl.cache.storage import localfile, readers
from coordl.datasets import admission, sources
from coordl.datasets.base import CoordlDataset, cached, check_size, epoch_of
from coordl.datasets.onerror import READABLE, sample_error, skip_or_raise
from coordl.errors import ConfigError, SampleError, at_item
from coordl.manifest.build import IMG_EXTENSIONS, scan
from coordl.pipelines import batchprep, cpu, crop


def _read_ahead(ds: ImageFolder, items: list[int]) -> dict[int, concurrent.futures.Future]:
    """Start reading `items` from storage on this process's reader threads (readers.py's one pool
    per process, made on first use: a pool inherited through fork has no threads)."""
    if not items:
        return {}
    if ds.objects is not None:  # objects: one concurrent request per miss (cache/storage/readers.py)
        return ds.objects.read_ahead(items, ds.counters)
    pool, drop = readers.reader_pool(), ds.drop_page_cache
    m = ds.manifest
    return {i: pool.submit(localfile.read_file, m.path(i), drop, readers.listed(m, i)) for i in items}


def check_pipeline_args(transform: Any, size: Any, on_error: Any) -> int | tuple[int, int]:
    """The image pipeline's arguments, shared by ImageFolder and WebDataset: ConfigError naming a
    bad one; the size as `check_size` normalises it."""
    if isinstance(transform, str) and transform not in names.TRANSFORMS:
        raise ConfigError(f"transform={transform!r} is not known: use 'train', 'val', None or a callable")
    if on_error not in names.ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} must be 'raise' or 'skip'")
    return check_size(size)





class ImageFolder(CoordlDataset):
    """A map-style dataset over ``root/<class>/<image>`` with torchvision's semantics.

    Args:
        root: folder with one sub-folder per class.
        transform: ``"train"`` (RandomResizedCrop + flip), ``"val"`` (resize +
            center crop), ``None`` (the decoded RGB PIL image, as torchvision) or
            a callable applied to the RGB PIL image.
        size: output size for ``"train"`` / ``"val"``: an int (height = width) or
            ``(height, width)``, as torchvision takes it; batches are
            ``(B, 3, height, width)``. ``(s, s)`` is kept as the int ``s``.
        extensions: file name endings that count as images.
        on_error: ``"raise"`` (a bad file raises `SampleError` naming it) or
            ``"skip"`` (the sample is dropped from its batch and counted).
        seed: augmentation seed; an item's randomness is a function of
            (seed, epoch, index).
        target_transform, is_valid_file: as in torchvision.
        rescan: walk the tree even if its persisted manifest says it is unchanged
            (after editing files in place; see coordl/manifest/store.py).
        manifest_cache: folder of persisted manifests (default
            ``$XDG_CACHE_HOME/coordl/manifests``); ``"off"`` scans at every start.
        storage_options: for a `root` that is an fsspec URL (``s3://bucket/prefix``, ``gs://``...):
            passed to its filesystem (``endpoint_url``, ``key``, ``secret``, ``anon``...; the AWS_*
            variables work too). `samples` then give URLs (cache/storage/readers.py).
        max_in_flight: requests in flight at once per process when reading from a URL.
        fetch_client: for ``s3://``: the client item GETs go through: ``"auto"`` (obstore when it
            is installed and `storage_options` map onto it, else s3fs), ``"obstore"`` or
            ``"s3fs"``; None: ``$COORDL_S3_CLIENT``, else auto. Listing always uses s3fs.
        read_ahead: for a `root` at a URL: while a worker prepares a batch, the GETs of the batch it
            gets next (``coordl.DataLoader`` tells it which) are already in flight, so a batch does
            not begin with a round trip's wait. At most one batch ahead per worker, never past the
            epoch's end, never an item the cache holds; each item is still read and counted once.
            False: each batch's GETs start when the batch does. None (the default): on when this
            process's GETs go through obstore, off through s3fs (measured: with s3fs's event-loop
            thread the second batch in flight cost the workers ~1 ms of CPU per image more than
            the wait it hid; obstore's runtime holds no GIL). No effect on a local folder.
    """

    read_ahead: bool | None = False  # a subclass that does not set it reads no batch ahead

    def __init__(
        self,
        root: str | os.PathLike,
        transform: str | Callable | None = "train",
        size: int | tuple[int, int] = 224,
        extensions: Sequence[str] | None = IMG_EXTENSIONS,
        on_error: str = "raise",
        seed: int = 0,
        target_transform: Callable | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        rescan: bool = False,
        manifest_cache: str | None = None,
        storage_options: dict | None = None,
        max_in_flight: int = 32,
        fetch_client: str | None = None,
        read_ahead: bool | None = None,
    ) -> None:
        size = check_pipeline_args(transform, size, on_error)
        read_ahead = sources.check_read_ahead(read_ahead)
        self.manifest, self.objects = sources.open_source(
            root, extensions, is_valid_file, on_error == "skip", rescan, manifest_cache, storage_options,
            max_in_flight, fetch_client) if sources.is_url(root) else (scan(
                root, extensions, is_valid_file, allow_empty=on_error == "skip", rescan=rescan,
                manifest_cache=manifest_cache), None)
        self.root = self.manifest.root
        self.transform, self.size, self.on_error, self.seed = transform, size, on_error, int(seed)
        self.target_transform, self.read_ahead = target_transform, read_ahead
        self.classes = list(self.manifest.classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.epoch = 0

    # -- torchvision attributes (built on demand: no per-item objects are kept) --
    @property
    def samples(self) -> list[tuple[str, int]]:
        """(path, class index) of every item, as torchvision's ``ImageFolder.samples``."""
        m = self.manifest
        return [(m.path(i), int(m.labels[i])) for i in range(len(m))]

    @property
    def imgs(self) -> list[tuple[str, int]]:
        """The same as `samples` (torchvision's older name)."""
        return self.samples

    @property
    def targets(self) -> list[int]:
        """The class index of every item, in item order (as torchvision's ``targets``)."""
        return self.manifest.labels.tolist()

    @property
    def fingerprint(self) -> str:
        """The manifest's fingerprint: changes whenever any item's bytes change (cache keys carry it)."""
        return self.manifest.fingerprint

    def __len__(self) -> int:
        return len(self.manifest)

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose augmentation `__getitem__` draws (coordl.DataLoader sets it each epoch)."""
        self.epoch = int(epoch)

    # -- the two halves (fetch: the base class's cache -> _read -> counters -> cache put) --
    def read(self, i: int) -> bytes:
        """Item i's encoded bytes from storage (the file, or the object at a URL): uncounted and
        uncached (`fetch` is the counted, cached read)."""
        path = self.manifest.path(i)
        try:
            if self.objects is not None:
                return self.objects.read_ahead([i])[i].result()
            return localfile.read_file(path, drop_page_cache=self.drop_page_cache,
                                     expect=readers.listed(self.manifest, i))
        except OSError as e:
            raise at_item(sample_error(path, f"cannot read the file ({e.strerror or e})", READABLE), i) from None

    def _read(self, i: int, pending: concurrent.futures.Future | None = None) -> bytes:
        """Item i from storage (or the read `pending` started), offered to the cache."""
        path = self.manifest.path(i)
        try:
            if pending is None and self.objects is not None:
                pending = self.objects.read_ahead([i], self.counters)[i]
            raw = localfile.read_file(path, drop_page_cache=self.drop_page_cache,
                                    expect=readers.listed(self.manifest, i)) if pending is None \
                else pending.result()
        except OSError as e:
            raise at_item(sample_error(path, f"cannot read the file ({e.strerror or e})", READABLE), i) from None
        self._stored({i: raw})  # counted; cached once its prep succeeded (admission.py)
        return raw

    def prep(self, raw, i: int, epoch: int | None = None, out: np.ndarray | None = None):
        """Decode and augment item i's bytes: (uint8 tensor (3, h, w), label)."""
        epoch = self.epoch if epoch is None else epoch
        if self.transform in names.TRANSFORMS:
            return torch.from_numpy(self.prep_into(raw, i, epoch, out)).permute(2, 0, 1), self._target(i)
        self.counters.add(decodes=1)
        try:
            img = cpu.decode(raw)
        except SampleError as e:
            raise self._sample_error(i, e) from None
        transform = self.transform
        if transform is not None and not callable(transform):  # __init__ refused it; set since
            raise ConfigError(f"transform={transform!r} is not known: use 'train', 'val', None or a callable")
        return (img if transform is None else transform(img)), self._target(i)

    def prep_into(self, raw, i: int, epoch: int, out: np.ndarray | None) -> np.ndarray:
        """The "train"/"val" pixels of item i as uint8 (h, w, 3), written into `out` if given
        (a `_PlanRow`: the item's bytes and plan instead, for DataLoader(device=...))."""
        self.counters.add(decodes=1)
        try:
            if isinstance(out, _PlanRow):
                rng = crop.item_rng(self.seed, epoch, i) if self.transform == "train" else None
                return out.keep(raw, batchprep.plan_item(raw, str(self.transform), self.size, rng))
            if self.transform == "train":
                return cpu.train(raw, self.size, crop.item_rng(self.seed, epoch, i), out=out)
            return cpu.val(raw, self.size, out=out)
        except SampleError as e:
            raise self._sample_error(i, e) from None

    def _sample_error(self, i: int, e: SampleError) -> SampleError:
        return at_item(sample_error(self.manifest.path(i), e), i)

    def _target(self, i: int):
        label = int(self.manifest.labels[i])
        return label if self.target_transform is None else self.target_transform(label)

    def __getitem__(self, i: int):
        sample = self._fetch_prep(i, self.epoch)
        self.counters.add(samples=1)
        return sample

    def _fetch_prep(self, i: int, epoch: int) -> Any:
        """`prep(fetch(i))`: item i's bytes are cached only if its prep succeeded (admission.py)."""
        with admission.admitting(self):
            sample = self.prep(self.fetch(i), i, epoch)
            admission.admit(self, i)
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list:
        """One batch; a `PreparedBatch` for "train"/"val", else a list of samples."""
        if self.coordinator is not None:  # a loader a framework re-created from loader.dataset
            return self.coordinator.framework_batch(indices)  # (coordinator/client.py)
        epoch = epoch_of(indices, self.epoch)
        if self.transform not in names.TRANSFORMS:
            out = []
            for i in indices:
                sample = self._try(lambda i=i: self._fetch_prep(i, epoch))
                if sample is not None:
                    out.append(sample)
            self.counters.add(samples=len(out))
            return out
        if self.binding is not None and self.binding.encoded:
            return self._encoded_batch(indices, epoch)  # pyright: ignore[reportReturnType] (collate passes it on)
        images, pooled = self._alloc_batch(len(indices))
        labels = np.empty(len(indices), dtype=np.int64)
        kept: list[int] = []
        try:
            self.prep_rows(indices, epoch, images.numpy(), labels, kept=kept)
        except BaseException:
            if pooled and self.binding is not None:  # pooled: the binding's buffers
                self.binding.buffers.give_back(images.untyped_storage())
            raise
        n = len(kept)
        targets = torch.from_numpy(labels[:n]) if self.target_transform is None else \
            torch.utils.data.default_collate([self._target(i) for i in kept])
        return PreparedBatch(images[:n].permute(0, 3, 1, 2), targets, kept, pooled)

    def device_contract(self) -> str:
        """"" when DataLoader(device=...) can take this dataset: with transform 'train' or 'val'."""
        if self.transform in names.TRANSFORMS:
            return ""
        return f"{type(self).__name__}(transform={self.transform!r}): the device path takes 'train' or 'val'"

    def _encoded_batch(self, indices: Sequence[int], epoch: int) -> EncodedBatch:
        """The batch's bytes and plans (DataLoader(device=...)), through the same `prep_rows` (every
        fetch path, skips and counters), with the decode swapped for `batchprep.plan_item`."""
        rows = _PlanRows()
        labels = np.empty(len(indices), dtype=np.int64)
        kept: list[int] = []
        n = self.prep_rows(indices, epoch, rows, labels, kept=kept)  # pyright: ignore[reportArgumentType]
        targets = torch.from_numpy(labels[:n]) if self.target_transform is None else \
            [self._target(i) for i in kept]
        return EncodedBatch(rows.raws, rows.plans, kept, targets)

    def prep_rows(self, indices: Sequence[int], epoch: int, images: np.ndarray, labels: np.ndarray,
                  ids: np.ndarray | None = None, kept: list[int] | None = None) -> int:
        """Fetch, decode and augment `indices` into rows 0.. of `images` (n, size, size, 3) uint8,
        their labels into `labels` (and the items into `ids`); returns how many rows were kept.

        The one fetch -> prep -> skip loop: a bad item raises `SampleError` naming its file or,
        with on_error="skip", is counted and skipped, and the later rows move up. Used by
        `__getitems__` and by the coordinator's prep workers.
        """
        cache = self.cache
        early = self._take_ahead(indices, epoch)
        if early is not None:  # this batch was looked up and its misses' GETs started by the last one
            hits, pending = early
        else:
            hits = cache.get_many(indices, self.counters) if hasattr(cache, "get_many") else \
                cached(cache, indices, self.counters) if self.objects is not None else None
            # a partitioned cache's misses are read from storage by threads while the hits decode
            pending = {} if hits is None else _read_ahead(self, [int(i) for i in indices if int(i) not in hits])
        self._start_ahead(getattr(indices, "ahead", None), epoch)
        row = 0
        with admission.admitting(self):  # a read is cached once its prep succeeded
            for i in indices:
                i = int(i)
                raw = None if hits is None else hits.get(i)
                try:
                    if raw is None:
                        raw = self.fetch(i) if hits is None else self._read(i, pending.pop(i, None))
                    self.prep_into(raw, i, epoch, images[row])
                    admission.admit(self, i)  # its bytes, if just read, go to the cache now
                except SampleError as e:
                    skip_or_raise(self.on_error, self.counters, e)
                    continue
                except Exception as e:  # not the item's fault; a prep worker's report names the item
                    at_item(e, i)
                    raise
                labels[row] = self.manifest.labels[i]
                if ids is not None:
                    ids[row] = i
                if kept is not None:
                    kept.append(i)
                row += 1
        self.counters.add(samples=row)
        return row

    def _take_ahead(self, indices: Sequence[int], epoch: int) -> tuple[dict, dict] | None:
        """(hits, {miss: future}) of this batch if the last one read it ahead (cache/storage/readers.py)."""
        objects = self.objects
        return objects.take(epoch, indices, self.counters) if self.read_ahead is not False and objects is not None \
            else None

    def _start_ahead(self, ahead: Sequence[int] | None, epoch: int) -> None:
        """Look up the batch this worker gets next (`EpochBatch.ahead`) in the cache and start its
        misses' GETs, for the next `prep_rows` to take (at most one batch held per process)."""
        objects = self.objects
        if ahead and objects is not None and sources.reads_ahead(self.read_ahead, objects.store):
            objects.start_ahead(epoch, ahead, cached(self.cache, ahead, self.counters))
        elif ahead and hasattr(self.cache, "send_ahead"):  # a partitioned cache: its MGETs go out now
            self.cache.send_ahead(ahead)

    def _alloc_batch(self, n: int) -> tuple[torch.Tensor, bool]:
        """uint8 (n, h, w, 3), and whether it is in a reusable buffer: in shared memory in a
        worker process, one of the worker's reusable buffers when the loader allows them
        (``batch_slots``, coordl/buffers.py)."""
        h, w = crop.output_hw(self.size)
        if torch.utils.data.get_worker_info() is None:
            return torch.empty((n, h, w, 3), dtype=torch.uint8), False
        nbytes = n * h * w * 3
        binding = self.binding
        if binding is not None and binding.batch_slots:
            if binding.buffers is None or binding.buffers.fork.forked():  # made in each worker
                binding.buffers = WorkerBuffers(binding.batch_slots)
            storage_, pooled, fresh = binding.buffers.acquire(nbytes)
        else:
            storage_, pooled, fresh = new_shared(nbytes), False, True
        if fresh:
            self.counters.add(batch_buffers=1)
        images = torch.empty(0, dtype=torch.uint8).set_(storage_, 0, (n, h, w, 3), (h * w * 3, w * 3, 3, 1))
        return images, pooled

    def _try(self, work: Callable[[], Any]) -> Any:
        try:
            return work()
        except SampleError as e:
            skip_or_raise(self.on_error, self.counters, e)
            return None

    def _skip_or_raise(self) -> None:
        """Inside an `except SampleError`: re-raise it, or count it under on_error="skip"
        (coordl/datasets/onerror.py)."""
        err = sys.exc_info()[1]
        assert isinstance(err, SampleError), "called only from an except SampleError block"
        skip_or_raise(self.on_error, self.counters, err)

    def served_as(self) -> tuple[str, Any, Any]:
        """(root, transform, size): what a coordinator Hello names this dataset by (coordinator/hello.py)."""
        return os.fspath(self.root), self.transform, self.size

    def __repr__(self) -> str:
        return (f"ImageFolder(root={self.root!r}, items={len(self)}, classes={len(self.classes)}, "
                f"transform={self.transform!r}, size={self.size})")


class _PlanRows:
    """Stands for the batch buffer in `prep_rows` when a worker sends bytes (DataLoader(device=...)):
    row k collects the kept item's bytes and plan instead of its pixels."""

    def __init__(self) -> None:
        self.raws: list[bytes] = []
        self.plans: list[batchprep.ItemPlan] = []

    def __getitem__(self, row: int) -> _PlanRow:
        return _PlanRow(self, row)


class _PlanRow:
    def __init__(self, rows: _PlanRows, row: int) -> None:
        self.rows, self.row = rows, row

    def keep(self, raw, plan: batchprep.ItemPlan) -> Any:
        del self.rows.raws[self.row:], self.rows.plans[self.row:]  # a row skipped before is written again
        self.rows.raws.append(bytes(raw))
        self.rows.plans.append(plan)
        return None
