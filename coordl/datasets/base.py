"""`coordl.CoordlDataset`: the contract a dataset writes to get coordl's loader around it.

    class MyDataset(coordl.CoordlDataset):
        def __len__(self) -> int: ...
        @property
        def fingerprint(self) -> str: ...            # changes whenever any item's bytes change
        def read(self, i: int) -> bytes: ...         # item i's encoded bytes, from storage
        def prep(self, raw, i: int, epoch: int):     # decode + augment -> a sample torch collates
            rng = self.rng(i, epoch)                 # the item's randomness: (seed, epoch, i)

A dataset is a manifest plus two halves (docs: /shared/design.md): `read` goes to
storage, `prep` decodes and augments. Everything between them is the base class's,
so a subclass gets it without writing it:

- ``fetch(i)``: the cache (``coordl.DataLoader(cache=...)``: MinIO or partitioned)
  -> on a miss `read` -> counted (``storage_reads``, ``storage_bytes``) -> offered to
  the cache (``cache_inserts``) once the item's prep succeeded (inside a batch or
  ``ds[i]``: coordl/datasets/admission.py), so bytes that do not decode never take
  cache space. `fetch` is what every caller of a coordl dataset may call; `read` is
  what a subclass writes.
- ``fetch_many(items)``, a batch's fetch: the cache lookups for all its items, then ONE
  `read_many` call with the misses, then the counters and cache puts. `read_many` is
  optional: override it to read a batch's misses together (concurrently from object
  storage, one request for neighbours in a file); the default calls `read` for each.
- ``ds[i]`` and ``__getitems__`` (torch's batch call): fetch -> prep, ``decodes`` and
  ``samples`` counted; a `SampleError` (or an OSError) from `read`/`read_many`, or a
  `SampleError` from `prep`, raises (naming the item), or with ``on_error = "skip"``
  drops the sample from its batch and counts it in ``errors_skipped``. Any other
  exception is a bug and propagates.
- ``rng(i, epoch)`` / ``np_rng(i, epoch)``: the one source of randomness for `prep`,
  a pure function of (seed, epoch, item), so batches are the same whatever
  ``num_workers`` is, after a resume, on every rank and at the coordinator daemon.
- ``set_epoch``, ``seed``, ``on_error`` and the loader's binding (`bind`).

Class attributes a subclass may set (or pass to ``super().__init__``): ``seed`` (0)
and ``on_error`` ("raise"). ImageFolder, WebDataset and AudioFolder are subclasses
with batch paths of their own (ImageFolder starts a batch's reads on threads and decodes
while they are in flight; WebDataset coalesces neighbouring tar members into one pread);
a user's subclass overrides at most `read_many`.
"""

from __future__ import annotations

import copy
import os
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch

from coordl import names
from coordl.datasets import admission
from coordl.datasets.binding import NO_COUNTERS, Binding, Counting
from coordl.datasets.onerror import skip_or_raise
from coordl.errors import ConfigError, SampleError, at_item
from coordl.pipelines import crop


def check_size(size: Any) -> int | tuple[int, int]:
    """`size` as the image datasets keep it: a positive int, or (height, width) of two when they differ."""
    def positive(v: Any) -> bool:  # a bool is not a size
        return bool((type(v) is int or isinstance(v, np.integer)) and v > 0)

    if positive(size):
        return int(size)
    if isinstance(size, (tuple, list)) and len(size) == 2 and all(positive(v) for v in size):
        h, w = int(size[0]), int(size[1])
        return h if h == w else (h, w)
    raise ConfigError(f"size={size!r} must be a positive int (height = width) or (height, width) of "
                      "two positive ints, as torchvision takes it: e.g. size=224 or size=(224, 160)")


def epoch_of(indices: Sequence[int], default: int) -> int:
    """The epoch the loader tagged a batch (or its first index) with, else the dataset's own."""
    epoch = getattr(indices, "epoch", None)
    if epoch is None and len(indices):
        epoch = getattr(indices[0], "epoch", None)
    return default if epoch is None else epoch


def _from_binding(name: str, default: Any) -> Any:
    """A read-only property of a coordl dataset: its binding's `name`, else `default`."""
    def get(self: CoordlDataset) -> Any:
        binding = self.binding
        return default if binding is None else getattr(binding, name)

    def set_default(self: CoordlDataset, value: Any) -> None:
        if (value is not default and value != default) or self.binding is not None:
            raise AttributeError(f"{type(self).__name__}.{name} is the loader's (coordl/datasets/binding.py): "
                                 f"bind the dataset with it, e.g. dataset.bind({name}=...)")

    return property(get, set_default, doc=f"The binding's {name} ({default!r} when unbound).")


_FINGERPRINT = re.compile(r"[A-Za-z0-9_-]{1,128}")  # it names files in /dev/shm and Redis keys


def require_fingerprint(dataset: Any, what: str) -> str:
    """`dataset.fingerprint`, or a ConfigError saying that `what` (``"cache="``...) needs it and how
    to write it. Every cache key, shared-memory name and Redis key carries the fingerprint, so a
    changed dataset is never served stale bytes: a dataset without one cannot be cached."""
    fingerprint = getattr(dataset, "fingerprint", None)
    if isinstance(fingerprint, str) and _FINGERPRINT.fullmatch(fingerprint):
        return fingerprint
    name = type(dataset).__name__
    got = "has no `fingerprint` property" if fingerprint is None else f"has fingerprint={fingerprint!r}"
    raise ConfigError(
        f"{what} needs the dataset's `fingerprint` (1 to 128 letters, digits, '-' or '_' that change "
        f"whenever any item's bytes change: cache segments, Redis keys and the coordinator name items by "
        f"it), and {name} {got}: define `@property def fingerprint(self) -> str` on {name}, e.g. "
        f"hashlib.sha256 of the item names, sizes and modification times (or of the bytes) .hexdigest(), "
        f"or leave {what} unset")


def cached(cache: Any, items: Iterable[int], counters: Any) -> dict[int, Any]:
    """{item: bytes} of the `items` that `cache` holds ({} without a cache), counted once here:
    a partitioned cache (`get_many`) counts its own local/remote hits; a MinIO cache's hits and
    misses are counted as cache_hits / cache_misses."""
    if cache is None:
        return {}
    items = [int(i) for i in items]
    if hasattr(cache, "get_many"):
        return dict(cache.get_many(items, counters))
    hits = {}
    for i in items:
        raw = cache.get(i)
        if raw is not None:
            hits[i] = raw
    counters.add(cache_hits=len(hits), cache_misses=len(items) - len(hits))
    return hits


class CoordlDataset(torch.utils.data.Dataset):
    """The base of every dataset `coordl.DataLoader` binds, caches and coordinates.

    A subclass writes `__len__`, `fingerprint`, `read` and `prep` (see the module docstring); a
    dataset that merely has methods of those names without deriving from this class is *not*
    one: coordl.DataLoader treats it exactly as torch does.
    """

    seed: int = 0           # order and augmentation seed: rng(i, epoch) is a function of (seed, epoch, i)
    on_error: str = "raise"  # a SampleError from read or prep: "raise", or "skip" (dropped and counted)
    epoch: int = 0          # the epoch `ds[i]` uses (the loader tags batches with theirs)
    _held: dict[int, Any] | None = None  # reads waiting for their prep (coordl/datasets/admission.py)
    _deferred: dict[int, Any] | None = None  # reads waiting for DALI's decode (admission.defer)

    def __init__(self, *, seed: int = 0, on_error: str = "raise") -> None:
        """Optional: a subclass may call it to set (and check) `seed` and `on_error`."""
        self.seed, self.on_error = seed, on_error
        self._check_contract()

    # -- the contract: what a subclass writes --
    def __len__(self) -> int:
        """The number of items."""
        raise NotImplementedError(f"{type(self).__name__}.__len__: write it (coordl.CoordlDataset's contract)")

    def read(self, i: int) -> bytes:
        """Item i's encoded bytes, from storage (uncounted, uncached: `fetch` does both). Raise
        `SampleError` for an item that cannot be read (an OSError is turned into one)."""
        raise NotImplementedError(f"{type(self).__name__}.read(i) -> bytes: write it (the item's bytes "
                                  "from storage; coordl.CoordlDataset's contract)")

    def read_many(self, items: list[int]) -> dict[int, bytes | Exception]:
        """Optional: the encoded bytes of several items (a batch's cache misses, distinct), read
        together: ``{item: bytes}``, or for an item that cannot be read the exception reading it
        raised (a `SampleError` or an OSError: that item alone is raised naming it, or skipped).
        Override it to read a batch's misses together, e.g. concurrently from object storage;
        called once per batch with the misses only. Uncounted and uncached, as `read`. The
        default calls `read` for each item."""
        out: dict[int, bytes | Exception] = {}
        for i in items:
            try:
                out[i] = self.read(i)
            except (SampleError, OSError) as e:
                out[i] = e
        return out

    def prep(self, raw, i: int, epoch: int | None = None):
        """Decode and augment item i's bytes `raw` into a sample torch collates. Draw randomness
        from ``self.rng(i, epoch)``; raise `SampleError` for bytes that cannot be decoded."""
        raise NotImplementedError(f"{type(self).__name__}.prep(raw, i, epoch) -> sample: write it "
                                  "(decode + augment; coordl.CoordlDataset's contract)")

    def rng(self, i: int, epoch: int | None = None) -> random.Random:
        """Item i's generator in `epoch` (default: the dataset's): a `random.Random` that is a pure
        function of (seed, epoch, i), the one the built-in crops draw from (pipelines/crop.py)."""
        return crop.item_rng(int(self.seed), int(self.epoch if epoch is None else epoch), int(i))

    def np_rng(self, i: int, epoch: int | None = None) -> np.random.Generator:
        """As `rng`, as a numpy `Generator` (PCG64 seeded from (seed, epoch, i))."""
        epoch = self.epoch if epoch is None else epoch
        mask = (1 << 64) - 1
        return np.random.default_rng([int(self.seed) & mask, int(epoch) & mask, int(i) & mask])

    def set_epoch(self, epoch: int) -> None:
        """The epoch `ds[i]` uses (the loader tags each batch with its own)."""
        self.epoch = int(epoch)

    # -- what the loader attaches --
    #: What a loader attached (`bind`): counters, cache, buffers, coordinator
    #: (coordl/datasets/binding.py). None on the dataset the user made, which never changes.
    binding: Binding | None = None

    def bind(self, binding: Binding | None = None, *, counters: Counting | None = None, cache: Any = None,
             drop_page_cache: bool = False) -> Any:
        """A light copy of this dataset that carries `binding` (or one of `counters`, `cache`
        and `drop_page_cache`). The copy shares everything read-only (the manifest arrays);
        the loader owns it and may set its binding's batch buffers and its epoch."""
        self._check_contract()
        if binding is None:
            binding = Binding(counters if counters is not None else NO_COUNTERS, cache, bool(drop_page_cache))
        bound = copy.copy(self)
        bound.binding = binding
        return bound

    @property
    def is_bound(self) -> bool:
        """Is this a loader's bound copy (`bind`)? A loader built over one keeps its binding."""
        return self.binding is not None

    # What the dataset reads from its binding (the unbound defaults without one). Read-only:
    # the binding is the loader's; assigning the unbound default is accepted, as subclasses
    # written before the binding declared these in __init__.
    counters = _from_binding("counters", NO_COUNTERS)
    cache = _from_binding("cache", None)
    drop_page_cache = _from_binding("drop_page_cache", False)
    batch_slots = _from_binding("batch_slots", 0)
    coordinator = _from_binding("coordinator", None)

    def _check_contract(self) -> None:
        """ConfigError naming what a subclass got wrong: a bad on_error or seed, no read or prep."""
        name = type(self).__name__
        if self.on_error not in names.ON_ERROR:
            raise ConfigError(f"{name}.on_error={self.on_error!r} must be 'raise' or 'skip'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise ConfigError(f"{name}.seed={self.seed!r} must be an int")
        cls = type(self)
        for method, base in (("read", "fetch"), ("prep", "__getitems__")):
            if getattr(cls, method) is getattr(CoordlDataset, method) and \
                    getattr(cls, base) is getattr(CoordlDataset, base):
                raise ConfigError(f"{name} does not define `{method}`, which a coordl.CoordlDataset writes "
                                  f"(read(i) -> bytes from storage; prep(raw, i, epoch) -> sample): see "
                                  "docs/datasets.md, 'Write your own dataset'")

    # -- what the base class puts around read and prep --
    def fetch(self, i: int) -> bytes | memoryview:
        """The encoded bytes of item i, from the cache when it holds them, else `read` (counted,
        and offered to the cache)."""
        hit = cached(self.cache, [i], self.counters).get(i)
        return hit if hit is not None else self._read(i)

    def _read(self, i: int, pending: Any = None) -> bytes:
        """Item i from storage through `read`, counted and offered to the cache."""
        try:
            raw = self.read(i)
        except (SampleError, OSError) as e:
            raise self._read_error(i, e) from e.__cause__ if isinstance(e, SampleError) else e
        self._stored({i: self._checked(raw, "read", i)})
        return raw

    def fetch_many(self, items: Sequence[int]) -> tuple[dict[int, Any], dict[int, SampleError]]:
        """(bytes per item, SampleError per item) of a batch's distinct `items`: the cache lookups
        for all of them, then one `read_many` call for the misses (none when every item hit), then
        ``storage_reads`` (items read) and ``storage_bytes`` counted and the bytes offered to the
        cache. An item `read_many` could not read is in the second dict, as a SampleError naming it."""
        items = list(dict.fromkeys(int(i) for i in items))
        if type(self).read is CoordlDataset.read and type(self).fetch is not CoordlDataset.fetch:
            return self._fetch_each(items)  # a subclass that wrote its own fetch instead of read
        hits = cached(self.cache, items, self.counters)
        misses = [i for i in items if i not in hits]
        if not misses:
            return hits, {}
        got = self.read_many(list(misses))
        if not isinstance(got, dict) or any(i not in got for i in misses):
            lost = misses if not isinstance(got, dict) else [i for i in misses if i not in got]
            raise ConfigError(f"{type(self).__name__}.read_many({misses[:8]}{'...' if len(misses) > 8 else ''}) "
                              f"returned {type(got).__name__ if not isinstance(got, dict) else 'a dict'} without "
                              f"items {lost[:8]}: it must return {{item: bytes or the exception reading it}} for "
                              "every item asked for")
        errors: dict[int, SampleError] = {}
        read: dict[int, Any] = {}
        for i in misses:
            value = got[i]
            if isinstance(value, (SampleError, OSError)):
                errors[i] = self._read_error(i, value)
            elif isinstance(value, BaseException):  # not the item's fault: a bug, as from read
                raise at_item(value, i)
            else:
                read[i] = self._checked(value, "read_many", i)
        self._stored(read)
        hits.update(read)
        return hits, errors

    def _fetch_each(self, items: list[int]) -> tuple[dict[int, Any], dict[int, SampleError]]:
        raws: dict[int, Any] = {}
        errors: dict[int, SampleError] = {}
        for i in items:
            try:
                raws[i] = self.fetch(i)
            except SampleError as e:
                errors[i] = at_item(e, i)
        return raws, errors

    def _read_error(self, i: int, e: SampleError | OSError) -> SampleError:
        """What reading item i raised (or read_many returned for it), as the SampleError naming it."""
        if isinstance(e, SampleError):
            return at_item(e, i)
        err = SampleError(f"{type(self).__name__} item {i}: cannot read it ({e}): check the storage, or pass "
                          "on_error='skip'")
        err.__cause__ = e
        return at_item(err, i)

    def _checked(self, raw: Any, method: str, i: int) -> Any:
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise ConfigError(f"{type(self).__name__}.{method} gave {type(raw).__name__} for item {i}: it must "
                              "give the item's encoded bytes (decode in prep)")
        return raw

    def _stored(self, read: dict[int, Any]) -> None:
        """Items just read from storage: counted, and offered to the cache (held until their prep
        succeeded inside a batch: `admission.admitting`)."""
        if not read:
            return
        self.counters.add(storage_reads=len(read), storage_bytes=sum(len(raw) for raw in read.values()))
        admission.offer(self, read)

    def _prep(self, raw, i: int, epoch: int, prep: Any = None) -> Any:
        """`prep` (or the `prep` given), counted as one decode; its SampleError notes the item. The
        item's bytes, if just read and held, are offered to the cache once it returned (`admission.admit`)."""
        self.counters.add(decodes=1)
        try:
            sample = (prep or self.prep)(raw, i, epoch)
        except SampleError as e:
            raise at_item(e, i) from e.__cause__
        admission.admit(self, i)
        return sample

    def _fetch_prep(self, i: int, epoch: int) -> Any:
        """`_prep(fetch(i))`: item i's bytes are cached only if its prep succeeded."""
        with admission.admitting(self):
            return self._prep(self.fetch(i), i, epoch)

    def __getitem__(self, i: int):
        epoch = getattr(i, "epoch", None)
        sample = self._fetch_prep(int(i), self.epoch if epoch is None else epoch)
        self.counters.add(samples=1)
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list:
        """One batch: a list of samples (torch's collate stacks them). Its bytes come from
        `fetch_many` (the cache lookups, then one `read_many` call for the misses); a skipped
        item is left out."""
        if self.coordinator is not None:  # a loader a framework re-created from loader.dataset
            return self.coordinator.framework_batch(indices)  # (coordinator/client.py)
        epoch = epoch_of(indices, self.epoch)
        if self.binding is not None and self.binding.encoded:
            return self._encoded_batch(indices, epoch)
        out = [sample for _i, sample in self._prep_batch(indices, epoch)]
        self.counters.add(samples=len(out))
        return out

    def _prep_batch(self, indices: Sequence[int], epoch: int, prep: Any = None) -> Iterator[tuple[int, Any]]:
        """(item, sample) of each item of a batch whose bytes could be read and prepped, in order:
        the batch's bytes fetched together (`fetch_many`), a SampleError raised or counted and skipped;
        the bytes read from storage are cached as each item's prep succeeds (`admission`). `prep`
        (raw, i, epoch) -> sample stands for `self.prep` (DataLoader(device=...): the item's plan)."""
        items = [int(i) for i in indices]
        with admission.admitting(self):
            raws, errors = self.fetch_many(items)
            for i in items:
                try:
                    if i in errors:
                        raise errors[i]
                    sample = self._prep(raws[i], i, epoch, prep)
                except SampleError as e:
                    skip_or_raise(self.on_error, self.counters, e)
                    continue
                yield i, sample

    # -- DataLoader(device=...): the batch's bytes and crop plans; the training process decodes --
    def device_contract(self) -> str:
        """Why this dataset cannot go on DataLoader(device=...)'s path, or "" when it can.

        A subclass of JPEG (or other image) items opts in by declaring ``transform = "train"``
        (or ``"val"``: the built-in crops, as ImageFolder's) and ``size`` (224, or (h, w)), and
        writing ``label(i) -> int``; its workers then send each item's bytes and its crop plan
        drawn from ``self.rng(i, epoch)``, and `prep` is not called. Write `prep` as the same
        pipeline on the CPU (``coordl.pipelines.cpu.train(raw, self.size, self.rng(i, epoch))``)
        to get the same batches without ``device=``."""
        name = type(self).__name__
        if getattr(self, "transform", None) not in names.TRANSFORMS:
            return (f"{name} has no transform='train' or 'val' (the built-in crops the device path draws); "
                    "declare one, with `size` and `label(i)`")
        if not callable(getattr(self, "label", None)):
            return f"{name} has no label(i) -> int, which the device path sends with each item's bytes"
        try:
            check_size(getattr(self, "size", None))
        except ConfigError as e:
            return f"{name}.{e}"
        return ""

    def _sample_error(self, i: int, e: SampleError) -> SampleError:
        """A decode failure of item i found after its worker (the device path's batch decode)."""
        err = SampleError(f"{type(self).__name__} item {i}: {e}; pass on_error='skip' to skip such items")
        return at_item(err, i)

    def _plan(self, raw, i: int, epoch: int) -> tuple[bytes, Any]:
        """Item i's bytes and crop plan (pipelines/batchprep.py), drawn as the CPU pipeline draws."""
        from coordl.pipelines import batchprep

        me: Any = self  # transform and size are the subclass's (device_contract checked them)
        transform = str(me.transform)
        rng = self.rng(i, epoch) if transform == "train" else None
        try:
            return bytes(raw), batchprep.plan_item(raw, transform, me.size, rng)
        except SampleError as e:  # the bytes' header: not an image, or one the pipeline refuses
            raise self._sample_error(i, e) from None

    def _encoded_batch(self, indices: Sequence[int], epoch: int) -> Any:
        """An `EncodedBatch` of the items whose bytes could be read and planned (every fetch path,
        skips and counters as `__getitems__`), with their `label(i)` s."""
        from coordl.batch import EncodedBatch

        raws, plans, kept, labels = [], [], [], []
        label = cast(Any, self).label  # the subclass's (device_contract checked it)
        for i, (raw, plan) in self._prep_batch(indices, epoch, self._plan):
            raws.append(raw)
            plans.append(plan)
            kept.append(i)
            labels.append(int(label(i)))
        self.counters.add(samples=len(kept))
        return EncodedBatch(raws, plans, kept, torch.tensor(labels, dtype=torch.int64))

    # -- the coordinator daemon (coordl serve --dataset pkg.mod:Class) --
    def served_as(self) -> tuple[str, Any, Any]:
        """(where, kind, size) a coordinator Hello names this dataset by: for a user's subclass its
        class path as the kind (the daemon must run the same class), with `served_settings()` in
        brackets when there are any, and size 0 (the daemon's)."""
        cls = type(self)
        settings = self.served_settings()
        return describe(self), f"{cls.__module__}:{cls.__qualname__}" + (f" [{settings}]" if settings else ""), 0

    def served_settings(self) -> str:
        """Optional: the arguments that change what `prep` returns but neither the bytes
        (`fingerprint`), the seed, on_error nor the sample's shape and dtype show, as one short
        text such as ``"transform='val'"``. A coordinated job (``coordinator=``) whose dataset
        gives another text than the daemon's is refused naming both, instead of silently
        getting batches prepared another way. Default: none."""
        return ""

    def sample_spec(self) -> tuple[tuple[int, ...], str]:
        """(shape, dtype) of the tensor of every sample, as numpy names it ("float32"): what one row
        of the coordinator daemon's ring holds when it serves this dataset (``coordl serve
        --dataset pkg.mod:Class`` without --size; coordl/coordinator/spec.py), and what a job
        over it says when it attaches. A sample is ``(tensor, int label)``; the tensor's dtype is
        one of uint8, int16, int32, int64, float16, float32 or float64, and its shape is the same
        for every item (the daemon checks every sample against it).

        The default prepares one item once, in epoch 0: item 0, or with on_error="skip" the first
        that can be read and prepared. Override it to answer without decoding (and without a
        read), e.g. ``return (1, 16000), "float32"``."""
        for i in range(len(self)):
            try:
                sample = self._fetch_prep(i, 0)
            except SampleError:
                if self.on_error != "skip" or i + 1 >= min(len(self), _SPEC_TRIES):
                    raise
                continue
            arr, _label = _sample_parts(self, i, sample, "the sample spec")
            return tuple(int(d) for d in arr.shape), arr.dtype.name
        raise ConfigError(f"{type(self).__name__} has no items, so it has no sample spec: the coordinator "
                          "serves a dataset with items; override sample_spec() to give (shape, dtype)")

    def prep_rows(self, indices: Sequence[int], epoch: int, images: np.ndarray, labels: np.ndarray,
                  ids: np.ndarray | None = None, kept: list[int] | None = None) -> int:
        """The coordinator's prep with ``coordl serve --size N``: items into rows of `images` (n, h, w, 3)
        uint8 and `labels`; returns how many rows were kept. `prep` must return (image, label) with a
        uint8 image of (3, h, w) or (h, w, 3); anything else is refused."""
        def row(i: int, sample: Any) -> tuple[np.ndarray, int]:
            return _ring_row(self, i, sample, images.shape[1:])
        return self._rows(indices, epoch, images, labels, ids, kept, row)

    def prep_samples(self, indices: Sequence[int], epoch: int, out: np.ndarray, labels: np.ndarray,
                     ids: np.ndarray | None = None) -> int:
        """The coordinator's prep for a dataset served by its `sample_spec` (``coordl serve --dataset``
        without --size): items into rows of `out` (n, *shape) of the spec's dtype, unchanged, and
        `labels`; returns how many rows were kept. A sample whose tensor has another shape or dtype
        than `out`'s rows raises ConfigError naming the item, both specs and the fix."""
        def row(i: int, sample: Any) -> tuple[np.ndarray, int]:
            return _spec_row(self, i, sample, out)
        return self._rows(indices, epoch, out, labels, ids, None, row)

    def _rows(self, indices: Sequence[int], epoch: int, out: np.ndarray, labels: np.ndarray,
              ids: np.ndarray | None, kept: list[int] | None, row_of: Any) -> int:
        row = 0
        for i, sample in self._prep_batch(indices, epoch):
            out[row], labels[row] = row_of(i, sample)
            if ids is not None:
                ids[row] = i
            if kept is not None:
                kept.append(i)
            row += 1
        self.counters.add(samples=row)
        return row


_SPEC_TRIES = 64  # items sample_spec tries with on_error="skip" before it gives up


def _serve_name(ds: CoordlDataset) -> str:
    return f"coordl serve --dataset {type(ds).__module__}:{type(ds).__qualname__}"


def _sample_parts(ds: CoordlDataset, i: int, sample: Any, what: str) -> tuple[np.ndarray, int]:
    """(tensor as a numpy array, int label) of a (tensor, label) sample, else a ConfigError."""
    tensor, label = sample if isinstance(sample, (tuple, list)) and len(sample) == 2 else (sample, None)
    try:
        arr = tensor.numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor)
    except (TypeError, RuntimeError):  # bfloat16, a tensor on a device, one that requires grad
        arr = None
    if arr is None or arr.dtype.kind not in "biuf" or isinstance(label, bool) or \
            not isinstance(label, (int, np.integer, torch.Tensor)):
        raise at_item(ConfigError(
            f"{_serve_name(ds)}: prep({i}) returned {_describe(sample)}, which {what} cannot take: the "
            "coordinator's ring holds (tensor, int label) samples, a numpy array or CPU tensor of "
            "uint8, int16, int32, int64, float16, float32 or float64. Return such samples, or load this "
            "dataset without coordinator="), i)
    return arr, int(label)


def _spec_row(ds: CoordlDataset, i: int, sample: Any, out: np.ndarray) -> tuple[np.ndarray, int]:
    """(tensor, label) of a sample for a row of `out`, exactly its shape and dtype, or ConfigError."""
    arr, label = _sample_parts(ds, i, sample, "the daemon's ring")
    shape, dtype = tuple(out.shape[1:]), out.dtype
    if tuple(arr.shape) != shape or arr.dtype != dtype:
        name = type(ds).__qualname__
        raise at_item(ConfigError(
            f"{_serve_name(ds)}: prep({i}) returned {arr.dtype.name} {tuple(arr.shape)}, and the daemon's "
            f"ring holds {dtype.name} {shape} per sample (what {name}.sample_spec() gave at the daemon's "
            f"start; by default item 0's): make prep return {dtype.name} {shape} for every item (pad or "
            f"cut to a fixed length, cast with .astype / .to), or override {name}.sample_spec(); or "
            "load this dataset without coordinator="), i)
    return arr, label


def _ring_row(ds: CoordlDataset, i: int, sample: Any, hwc: tuple) -> tuple[np.ndarray, int]:
    """(image as (h, w, 3) uint8, label) of a sample for the daemon's image ring, or ConfigError."""
    image, label = sample if isinstance(sample, (tuple, list)) and len(sample) == 2 else (sample, None)
    arr = image.numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] == 3 and tuple(arr.shape[1:]) == tuple(hwc[:2]):
        arr = arr.transpose(1, 2, 0)
    if arr.dtype != np.uint8 or tuple(arr.shape) != tuple(hwc) or isinstance(label, bool) or \
            not isinstance(label, (int, np.integer, torch.Tensor)):
        raise at_item(ConfigError(
            f"{_serve_name(ds)}: prep({i}) returned "
            f"{_describe(sample)}; with --size the daemon's ring holds (image, label) samples: a uint8 image of "
            f"(3, {hwc[0]}, {hwc[1]}) or ({hwc[0]}, {hwc[1]}, 3) (coordl serve --size {hwc[0]}) and an int "
            "label. Serve this dataset with those samples, drop --size to serve its samples as they are "
            "(their shape and dtype from sample_spec()), or load it without coordinator="), i)
    return arr, int(label)


def _describe(sample: Any) -> str:
    if isinstance(sample, (tuple, list)):
        return "(" + ", ".join(_describe(s) for s in sample) + ")"
    shape = getattr(sample, "shape", None)
    return f"{type(sample).__name__} {tuple(shape)} {getattr(sample, 'dtype', '')}".strip() \
        if shape is not None else type(sample).__name__


_PLAIN = (str, int, float, bool, os.PathLike)


def describe(dataset: Any, args: dict | None = None) -> str:
    """How `coordl status` and a refusal name a dataset: its own repr when its class writes one, else
    ``module:Class(name=value, ...)`` with `args` (the daemon's --dataset-args) or, for a job's
    dataset, its public attributes of plain types (str, numbers, paths; seed and on_error last),
    never ``<module.Class object at 0x...>``. At most 200 characters."""
    cls = type(dataset)
    if args is None and cls.__repr__ is not object.__repr__:
        text = repr(dataset)
    else:
        if args is None:
            attrs = {k: v for k, v in vars(dataset).items() if not k.startswith("_") and isinstance(v, _PLAIN)}
            args = {k: v for k, v in attrs.items() if k not in ("seed", "on_error", "epoch")}
            args.update((k, attrs[k]) for k in ("seed", "on_error") if k in attrs)
        inner = ", ".join(f"{k}={v!r}" for k, v in args.items())
        text = f"{cls.__module__}:{cls.__qualname__}({inner})"
    return text if len(text) <= 200 else text[:197] + "..."


def from_import_path(spec: str, args: dict | None, seed: int, on_error: str) -> CoordlDataset:
    """``coordl serve --dataset pkg.mod:Class --dataset-args JSON``: ``Class(**args)``, a
    CoordlDataset, with the daemon's --seed and --on-error (set on it after construction; `args`
    may repeat them only with the same values)."""
    import importlib

    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname:
        raise ConfigError(f"--dataset {spec!r}: name the class as module:Class, e.g. --dataset mypkg.data:MyDataset")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"--dataset {spec!r}: cannot import {module_name!r} ({e}): install it, or add its "
                          "folder to PYTHONPATH in the daemon's environment") from None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and issubclass(obj, CoordlDataset)):
        raise ConfigError(f"--dataset {spec!r}: {qualname} in {module_name} is "
                          f"{'missing' if obj is None else type(obj).__name__}, not a coordl.CoordlDataset subclass")
    args = dict(args or {})
    for key, flag, value in (("seed", "--seed", seed), ("on_error", "--on-error", on_error)):
        if key in args and args[key] != value:
            raise ConfigError(f"--dataset-args gives {key}={args[key]!r} but the daemon's {flag} is {value!r}: "
                              f"give it once, with {flag}")
    try:
        dataset = obj(**args)
    except TypeError as e:
        raise ConfigError(f"--dataset {spec!r} --dataset-args {args!r}: {qualname}(**args) failed ({e}): "
                          "give the arguments its __init__ takes") from None
    dataset.seed, dataset.on_error = seed, on_error
    dataset._check_contract()
    return dataset
