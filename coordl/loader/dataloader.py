"""`coordl.DataLoader`: a `torch.utils.data.DataLoader` that knows coordl datasets.

It is an instance of torch's DataLoader and takes every one of its arguments
with the same meaning; any dataset behaves exactly as under torch. With a
coordl dataset (one that splits ``fetch``/``prep``, e.g. `coordl.ImageFolder`)
(a `coordl.datasets.imagefolder.CoordlDataset`) it works on a bound copy of it
(`CoordlDataset.bind`: ``loader.dataset``), never on the object you passed, and
additionally:

- counts epochs (each ``iter(loader)`` is one; `set_epoch` to resume) and
  tags every batch of indices with its epoch (`EpochBatch`), so augmentation
  is a pure function of (seed, epoch, item) even in persistent workers; a batch
  of the loader's own plan also carries the batch the same worker gets next
  (``ahead``), which a dataset at a URL reads early (ImageFolder's ``read_ahead``);
- collates the dataset's prepared batch without a copy: uint8 (B, 3, H, W)
  in channels_last memory format and int64 labels;
- lets each worker reuse a batch's shared-memory buffer once no tensor in the
  training process refers to that batch any more (coordl/buffers.py). A batch
  you keep stays yours; one you hand to *another process* (a multiprocessing
  queue) is not tracked there: clone() it first, or pass ``reuse_buffers=False``;
- sums counters over all worker processes: `stats()`;
- with ``cache="8GiB"`` (or a `coordl.MinIOCache`, or a `coordl.PartitionedCache`),
  serves items through the node-wide MinIO cache (or the servers' Redis cache
  nodes) and reads storage without filling the page cache (``drop_page_cache``,
  on by default with a cache);
- gives each rank of a distributed job its share of every epoch (``rank=``,
  ``world_size=``, by default torch.distributed's), disjoint and covering, padded
  as `DistributedSampler` pads; the order is `coordl.epochs.sampling.epoch_order` of
  (seed, epoch), the same function the coordinator daemon serves;
- resumes mid-epoch exactly: `state_dict()` / `load_state_dict()` (coordl/epochs/resume.py);
- with ``coordinator="unix:///path.sock"``, takes its batches from a
  `coordl serve` daemon that prepares each batch once for every job on the
  server (coordinator/client.py): `len`, the epoch loop and the batches are
  the same, the tensors view shared memory until the next batch is asked for.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from coordl.batch import collate
from coordl.buffers import EXTRA_SLOTS
from coordl.coordinator.client import connect
from coordl.datasets.base import CoordlDataset
from coordl.datasets.binding import Binding
from coordl.datasets.caching import cache_for
from coordl.epochs import resume
from coordl.epochs.sampling import EpochBatch, EpochIndex, PlanSampler, plan_sampler, with_ahead
from coordl.errors import ConfigError, CoordlError
from coordl.loader import elastic
from coordl.loader.iterators import MultiIter, Position, SingleIter
from coordl.loader.options import LoaderOptions
from coordl.loader.options import default_ranks as _default_ranks
from coordl.loader.stats import KEYS, Counters

T_co = TypeVar("T_co", covariant=True)


class _IndexStream:
    """Wraps the loader's index sampler: tags each batch of indices with its epoch (coordl
    datasets), skips the batches a loaded state says were received, and records a torch
    RandomSampler's seed for `state_dict`.

    torch's iterators keep the index sampler they were built with and re-iterate it for
    every epoch of persistent workers, so the epoch is read when iteration starts, not
    stored. The loader is held by weak reference: iterator -> sampler -> loader would
    otherwise form a cycle that keeps worker processes alive until gc runs.
    """

    def __init__(self, sampler, loader: DataLoader, tag, stride: int = 0) -> None:
        self.sampler, self.tag, self.stride = sampler, tag, stride  # stride: with_ahead's (0: no `ahead`)
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator:
        loader = self._loader()
        epoch, skip, rng = (0, 0, None) if loader is None else (loader.epoch, loader._epoch_skip,
                                                                 loader._sampler_rng)
        del loader  # a suspended generator (an epoch left unfinished) must not keep the loader alive
        return self._stream(epoch, skip, rng)

    def _stream(self, epoch: int, skip: int, rng) -> Iterator:
        if rng is not None:
            rng.begin()  # when torch's RandomSampler would draw its seed
        tag = self.tag
        items = (item for n, item in enumerate(self.sampler) if n >= skip)
        if self.stride:  # batches of the plan: each carries the same worker's next one (sampling.py)
            for batch, ahead in with_ahead(items, self.stride):
                yield EpochBatch(batch, epoch, ahead)
            return
        for item in items:
            yield item if tag is None else tag(item, epoch)

    def __len__(self) -> int:
        return len(self.sampler)


def _collect_dali_garbage() -> None:
    """Collect cyclic garbage before torch forks workers, when NVIDIA DALI is loaded.

    A DALI pipeline left in a reference cycle (not yet collected) is copied into every forked
    worker without the executor threads it owns; when the worker's garbage collector finalizes
    it, its destructor waits for those threads forever and the worker never sends a batch (seen:
    a DataLoader hung after an earlier DALI pipeline in the same process). Collected here, in the
    process that still has the threads, it is torn down properly and the workers inherit none.
    """
    if "nvidia.dali" in sys.modules:
        gc.collect()


def is_coordl_dataset(dataset: Any) -> bool:
    """Datasets that derive from `coordl.CoordlDataset`; anything else is left as torch leaves it."""
    return isinstance(dataset, CoordlDataset)


class DataLoader(torch.utils.data.DataLoader[T_co]):
    """Drop-in replacement for `torch.utils.data.DataLoader`; see the module docstring.

    Arguments beyond torch's (validated once by `coordl.loader.options.LoaderOptions`, which
    the loader keeps as ``loader.options``):
        cache: ``"8GiB"``, a `coordl.MinIOCache` or a `coordl.PartitionedCache` (coordl datasets).
        drop_page_cache: read storage without leaving its pages in the page cache
            (default: on when there is a cache).
        coordinator: ``"unix:///path.sock"`` of a `coordl serve` daemon to take batches from.
        reuse_buffers: workers reuse a batch's shared memory once you dropped it (default: on
            x86-64, whose store order makes the lock-free hand-over correct; off elsewhere;
            True on another CPU is refused, coordl/buffers.py).
        rank, world_size: this process's share of each epoch (default: torch.distributed's
            when it is initialised, else 0 and 1). Not applied when you pass your own
            ``sampler`` or ``batch_sampler`` (e.g. a `DistributedSampler`): that one decides.
        backend: ``"cpu"`` (coordl's pipeline in worker processes) or ``"dali"``
            (NVIDIA DALI fed from coordl's reader and caches; coordl/loader/dali.py).
        dali_device: with ``backend="dali"``: ``"cpu"`` (default; device_id=None) or ``"gpu"``
            (nvJPEG ``mixed`` decode and GPU resize; needs a CUDA GPU).
        device: ``"cuda"`` (or ``"cuda:1"``): workers send encoded bytes and crop plans, this
            process decodes and augments whole batches there (coordl/loader/devprep.py);
            ``"cpu"``: the same path on CPU tensors. None (default): workers prepare pixels.
        device_dtype: with ``device``: torch.uint8 (default), or torch.float32 / float16 /
            bfloat16, normalised with ImageNet's mean and std, channels_last.
        decoder: with ``device``: ``"auto"``, ``"nvimgcodec"``, ``"torchvision"`` or ``"cpu"``.
        device_buffers: with ``device``: the batches' output buffers kept on the device and
            reused once you dropped a batch (default 3: the one your loop still holds as it asks
            for the next, the one handed out, the one prepared ahead); batch k+1 is prepared while step k runs.
            0: each batch a new tensor, prepared when asked for (coordl/loader/devpool.py).
    """

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        cache=None,
        drop_page_cache: bool | None = None,
        coordinator: str | None = None,
        reuse_buffers: bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        backend: str = "cpu",
        dali_device: str = "cpu",
        device: str | torch.device | None = None,
        device_dtype: torch.dtype = torch.uint8,
        decoder: str = "auto",
        device_buffers: int = 3,
    ) -> None:
        _record_for_lightning(self, {k: v for k, v in locals().items() if k not in ("self", "__class__")})
        opts = self.options = LoaderOptions(cache, drop_page_cache, coordinator, reuse_buffers, rank,
                                            world_size, backend, dali_device)
        coordl_ds = is_coordl_dataset(dataset)
        opts.check_dataset(dataset, coordl_ds)
        if coordl_ds and collate_fn is None and (batch_size is not None or batch_sampler is not None):
            collate_fn = collate
        self._ranks = opts.ranks  # None: torch.distributed's, read when used
        user_sampler, user_shuffle = sampler, bool(shuffle)
        self._made_sampler = self._plan = None
        self._rank_cache: tuple = (None, None)
        sampler, shuffle = self._sharding(dataset, coordl_ds, sampler, batch_sampler, shuffle,
                                          drop_last, generator, opts.ranks is not None)
        dataset, self._counters = _bound(dataset, coordl_ds, opts, num_workers)
        self.device, self.device_dtype, self.decoder = _check_device(dataset, device, device_dtype, decoder,
                                                                     backend, coordinator)
        if self.device is not None:
            dataset.binding.encoded = True
            self._device_pool = _device_pool(device_buffers, self.device, self.device_dtype)
        self.backend, self.dali_device = backend, dali_device  # backend before torch's __init__:
        # check_worker_number_rationality reads it
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        self._coordl_dataset = coordl_ds
        self.reuse_buffers = opts.buffers_reused
        self._lend_buffers()
        self._next_epoch = 0
        self.epoch = -1
        self._skip = 0        # batches of the next epoch already received (load_state_dict)
        self._epoch_skip = 0  # ... of the epoch under way (torch may iterate the index sampler twice)
        self._position = Position()
        self._sampler_rng = resume.SamplerRNG(self.sampler) if type(self.sampler) is RandomSampler else None
        self._coordinator = None if coordinator is None else connect(
            coordinator, self.dataset, batch_size, user_shuffle, drop_last, timeout,
            custom=[a for a, v in (("sampler", user_sampler),
                                   ("batch_sampler", batch_sampler),
                                   ("collate_fn", collate_fn)) if v not in (None, collate)])

    def _sharding(self, dataset, coordl_ds, sampler, batch_sampler, shuffle, drop_last, generator, given):
        """The sampler that gives this rank its share (and, for coordl datasets, the plan's order)."""
        if sampler is not None or batch_sampler is not None:
            if given and self.world_size > 1:
                raise ConfigError(f"rank={self.rank}, world_size={self.world_size} and your own "
                                  f"{'sampler' if sampler is not None else 'batch_sampler'} both shard the "
                                  "dataset: drop rank/world_size (your sampler decides), or drop the sampler")
            return sampler, shuffle
        if isinstance(dataset, IterableDataset):
            if self.world_size > 1 and given:
                raise ConfigError(f"world_size={self.world_size}: an IterableDataset shards itself (use "
                                  "torch.utils.data.get_worker_info and your rank inside it): drop rank/world_size")
            return sampler, shuffle
        if coordl_ds and generator is None:
            # loader.sampler / loader.batch_sampler hold the whole epoch's order (a framework that
            # re-shards them, e.g. Accelerate, then shards once); our own iterators take this
            # rank's share of the same order (_index_sampler)
            self._plan = plan_sampler(len(dataset), dataset.seed, bool(shuffle))
            return self._plan, None
        if self.world_size > 1:
            seed = generator.initial_seed() if generator is not None else 0
            self._made_sampler = DistributedSampler(dataset, self.world_size, self.rank, shuffle=bool(shuffle),
                                                    seed=seed, drop_last=drop_last)
            return self._made_sampler, None
        return sampler, shuffle

    @property
    def rank(self) -> int:
        """This process's rank among `world_size`: as given, else torch.distributed's when used."""
        return _default_ranks(*(self._ranks or (None, None)))[0]

    @property
    def world_size(self) -> int:
        """The number of ranks each epoch is split over (as given, else torch.distributed's)."""
        return _default_ranks(*(self._ranks or (None, None)))[1]

    @property
    def _rank_sampler(self) -> PlanSampler | None:
        """This rank's share of the plan (None: one rank, or not the plan). Built when first needed,
        so a loader made before `init_process_group` still shards once the group exists."""
        if self._plan is None:
            return None
        rank, world = _default_ranks(*(self._ranks or (None, None)))
        if world == 1:
            return None
        key, cached = self._rank_cache
        if key != (rank, world):
            plan = self._plan
            sampler = PlanSampler(plan.items, plan.seed, plan.shuffle, rank, world, self.drop_last)
            sampler.set_epoch(plan.epoch)
            sampler.rests = plan.rests  # the same dict: an elastic resume's rest of an epoch (elastic.py)
            # the plan's loader has no batch_sampler of the user's: it collates iff batch_size is set
            batches = BatchSampler(sampler, self.batch_size, self.drop_last) if self.batch_size is not None else sampler
            self._rank_cache = ((rank, world), (sampler, batches))
            cached = self._rank_cache[1]
        return cached[0]

    @property
    def _rank_batches(self):
        return self._rank_cache[1][1] if self._rank_sampler is not None else None
    coordinator = property(lambda self: self._coordinator,
                           doc="The daemon client (coordinator/client.py) when batches come from `coordl serve`.")

    @property
    def _index_sampler(self):
        sampler = self._rank_batches if self._rank_sampler is not None else super()._index_sampler
        tag = (EpochBatch if self._auto_collation else EpochIndex) if self._coordl_dataset else None
        if tag is None and self._sampler_rng is None and not self._epoch_skip:
            return sampler
        # `ahead` only over the plan's own batches fed to torch's iterators, whose round-robin it
        # follows; a batch sampler of anyone else's (Accelerate, Lightning, yours) is left alone
        own = isinstance(sampler, BatchSampler) and isinstance(sampler.sampler, PlanSampler)
        stride = max(1, self.num_workers) if tag is EpochBatch and own and self.backend == "cpu" else 0
        return _IndexStream(sampler, self, tag, stride)

    def _get_iterator(self):
        if self.num_workers == 0:
            return SingleIter(self, self._position)
        _collect_dali_garbage()
        self._lend_buffers()  # before torch starts the workers, which copy the dataset
        return MultiIter(self, self._position)

    def _lend_buffers(self) -> None:
        """Tell the bound dataset how many reusable batch buffers each worker may keep (0: none).

        Set on the dataset's binding, not the iterator, so that a loader a framework re-creates from
        ``loader.dataset`` (Accelerate's `prepare`) reuses buffers too (coordl/buffers.py)."""
        if not isinstance(self.dataset, CoordlDataset):
            return
        binding = self.dataset.binding
        if binding is None:  # __init__ binds every coordl dataset (_bound below)
            raise CoordlError(f"coordl.DataLoader: its {type(self.dataset).__name__} has no binding: a dataset "
                              "must reach the loader through coordl.DataLoader(dataset, ...), which binds it")
        pooled = self.reuse_buffers and self.collate_fn is collate and self._auto_collation
        binding.batch_slots = (self.prefetch_factor or 2) + EXTRA_SLOTS if pooled else 0

    @property
    def _bound(self):
        """The bound coordl dataset the loader works on (the same object as ``loader.dataset``)."""
        return self.dataset

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter(loader)`` runs (to resume a run at epoch ``epoch``)."""
        if self._coordinator is not None:
            self._coordinator.set_epoch(epoch)
            return
        self._next_epoch, self._skip = int(epoch), 0
        if self._plan is not None:
            self._plan.rests.clear()  # epoch `epoch` whole, not what a loaded state left of it

    def __len__(self) -> int:
        coordinator = getattr(self, "_coordinator", None)
        if coordinator is not None:
            return len(coordinator)
        batches = self._rank_batches  # None: one rank, or not the plan
        return len(batches) if batches is not None else super().__len__()

    def check_worker_number_rationality(self) -> None:
        """Torch's warning about more worker processes than CPUs; backend="dali" starts none
        (its num_workers are DALI threads in this process: dali_loader.dali_threads)."""
        if self.backend != "dali":
            super().check_worker_number_rationality()

    def __iter__(self):
        if self._coordinator is not None:  # batches come from the daemon: coordinator/client.py
            epoch = self._coordinator.epoch(self.pin_memory)
            self.epoch = epoch.epoch
            return epoch
        self.epoch = self._next_epoch
        if isinstance(self.sampler, DistributedSampler) and self.sampler is not self._made_sampler:
            # a framework (Lightning) or you set the epoch on your DistributedSampler: follow it,
            # so a loader re-created every epoch still draws that epoch's augmentation
            self.epoch = max(self.epoch, int(self.sampler.epoch))
        self._next_epoch = self.epoch + 1
        pos = self._position
        self._epoch_skip, self._skip = self._skip, 0
        pos.epoch, pos.received, pos.active = self.epoch, self._epoch_skip, True
        pos.length = len(self) if not isinstance(self.dataset, IterableDataset) else None
        self._set_sampler_epoch(self.epoch)
        if isinstance(self.dataset, CoordlDataset):
            self.dataset.set_epoch(self.epoch)
        if self.backend == "dali":
            from coordl.loader.dali import dali_epoch
            return dali_epoch(self, self._index_sampler, self._bound, self._position)
        if self.device is not None:
            from coordl.loader.devprep import device_epoch
            return device_epoch(super().__iter__(), self._bound, self.decoder, self._device_pool, pos)
        if isinstance(self.dataset, IterableDataset) and self._epoch_skip:
            pos.received = 0  # the replayed batches are received (and counted) again, then dropped
            return self._replay(super().__iter__(), self._epoch_skip)
        return super().__iter__()

    def epoch_indices(self, epoch: int) -> list[int]:
        """The dataset items this rank gets in `epoch`, in order (a coordl dataset's plan)."""
        sampler = self._rank_sampler or self.sampler
        if not isinstance(sampler, PlanSampler):
            raise ConfigError("epoch_indices needs the loader's own plan (a coordl dataset without a user "
                              f"sampler or generator); this loader samples with {type(sampler).__name__}")
        return sampler.indices(epoch).tolist()

    def _set_sampler_epoch(self, epoch: int) -> None:
        for sampler in (self.sampler, self._rank_sampler):
            if isinstance(sampler, PlanSampler) or (isinstance(sampler, DistributedSampler)
                                                    and sampler is self._made_sampler):
                sampler.set_epoch(epoch)

    def _replay(self, it, skip: int):
        """An IterableDataset has no positions: read the batches already received again and drop them."""
        self._epoch_skip = 0
        for n, batch in enumerate(it):
            if n >= skip:
                yield batch

    # -- resume --
    def _identity(self) -> dict:
        ds = self.dataset
        return {"dataset": getattr(ds, "fingerprint", None) or type(ds).__name__,
                # torch: Dataset declares no __len__ (a map dataset has one by convention)
                "items": None if isinstance(ds, IterableDataset) else len(ds),  # pyright: ignore[reportArgumentType]
                "seed": getattr(ds, "seed", None) if self._coordl_dataset else None,
                "batch_size": self.batch_size, "drop_last": self.drop_last,
                "shuffle": self.sampler.shuffle if isinstance(self.sampler, PlanSampler)
                else type(self.sampler).__name__,
                "world_size": self.world_size}  # not the rank: every rank is at the same batch (Lightning
        # saves rank 0's state and loads it on every rank), and each rank's share follows from its rank

    def state_dict(self) -> dict:
        """Where the training loop is: the epoch under way and the batches of it received so far.

        Small, versioned and JSON-serialisable (coordl/epochs/resume.py says what it holds and what
        cannot be restored). ``load_state_dict`` on a fresh loader built the same way then
        yields exactly the remaining batches: same items, augmentation, order and labels.
        """
        if self._coordinator is not None:
            return self._coordinator.state_dict()
        pos = self._position
        if pos.unfinished:
            rng = self._sampler_rng.saved if self._sampler_rng is not None else None
            rest = self._plan.rests.get(pos.epoch) if self._plan is not None else None
            return resume.make_state(self._identity(), pos.epoch, pos.received, rng, self.rank,
                                     rest.stages if rest is not None else [])
        return resume.make_state(self._identity(), self._next_epoch, 0, None, self.rank)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue where `state` (from `state_dict`) left off, from the next ``iter(loader)``.

        Over coordl's own plan, `state` may also come from a job of another world size: the list of
        its ranks' states (states[r] from rank r; exact), a `coordl.merge_states` of them, or one
        rank's state (every rank taken to be at its batch, as in DDP): the rest of the epoch is
        re-split over this job's ranks (elastic resume, coordl/loader/elastic.py)."""
        if self._coordinator is not None:
            self._coordinator.load_state_dict(state)
            return
        if self._plan is not None:
            point = elastic.resume_point(elastic.merge_states(state) if isinstance(state, list) else state,
                                         self._identity())
            self._next_epoch, self._skip = point.epoch, point.skip
            self._plan.rests.clear()
            if point.rest is not None:
                self._plan.rests[point.epoch] = point
            return
        length = None if isinstance(self.dataset, IterableDataset) else len(self)
        epoch, batches, rng = resume.check_state(state, self._identity(), length)
        if length is not None and batches >= length:
            epoch, batches, rng = epoch + 1, 0, None
        self._next_epoch, self._skip = epoch, batches
        if self._sampler_rng is not None:
            self._sampler_rng.restore = rng

    def stats(self) -> dict[str, int]:
        """Counters summed over the main and all worker processes, over the loader's life;
        with a cache also its node-wide state: cache_bytes, cache_items, cache_capacity."""
        if self._coordinator is not None:
            return self._coordinator.stats()
        if self._counters is None:
            return dict.fromkeys(KEYS, 0)
        totals = self._counters.totals()
        cache = getattr(self.dataset, "cache", None)
        if cache is not None:
            totals.update(cache.stats())
        return totals


def _bound(dataset, coordl_ds: bool, opts: LoaderOptions, num_workers: int) -> tuple[Any, Counters | None]:
    """The dataset the loader works on and the counters it sums: a coordl dataset bound afresh
    (`Binding`: counters for `num_workers`, the cache of ``cache=``); a dataset that is already
    a loader's bound copy, when no cache argument is given, as it is (a framework re-created the
    loader from ``loader.dataset``: its counters and cache go on); any other dataset untouched."""
    if not coordl_ds:
        return dataset, None
    if dataset.is_bound and not opts.binds_anew:
        counters = dataset.counters
        if num_workers > counters.workers:
            raise ConfigError(
                f"num_workers={num_workers}: this dataset is a coordl.DataLoader's (loader.dataset), "
                f"whose counters have rows for {counters.workers} workers; pass num_workers<="
                f"{counters.workers}, or build this loader over your original dataset")
        return dataset, counters
    cache = None if opts.cache is None else cache_for(dataset, opts.cache)  # checks the fingerprint
    counters = Counters(num_workers)
    drop = cache is not None if opts.drop_page_cache is None else opts.drop_page_cache
    return dataset.bind(Binding(counters, cache, drop)), counters


def loader_stats(loader: Any) -> dict[str, int]:
    """The counters of any loader over a coordl dataset, whatever class re-created it.

    `coordl.DataLoader.stats()` for ours; for a loader a framework rebuilt from
    ``loader.dataset`` (Accelerate's ``DataLoaderShard``, Lightning's re-instantiation),
    the counters travel with the bound dataset, so they are read from there.
    """
    if isinstance(loader, DataLoader):
        return loader.stats()
    ds = getattr(loader, "dataset", None)
    coordinator = getattr(ds, "coordinator", None)
    if coordinator is not None:
        return coordinator.stats()
    counters = getattr(ds, "counters", None)
    if not isinstance(counters, Counters):
        raise ConfigError(f"loader_stats: {type(loader).__name__} does not read a dataset bound by "
                          "coordl.DataLoader: build a coordl.DataLoader over a coordl dataset first, "
                          "then hand that loader to the framework")
    totals = counters.totals()
    cache = getattr(ds, "cache", None)
    if cache is not None:
        totals.update(cache.stats())
    return totals


def _record_for_lightning(loader: DataLoader, arguments: dict) -> None:
    """Record the user's arguments the way Lightning's init wrapper would.

    Lightning re-instantiates loaders (to inject a DistributedSampler) from the arguments its
    `_replace_dunder_methods` wrapper saved on the first `__init__` it sees. It wraps the
    DataLoader subclasses that exist when `fit()` starts; if this class was first imported
    inside a hook (``import coordl`` before torch, then `coordl.DataLoader` in
    `train_dataloader`), only torch's own `__init__` is wrapped and would save the arguments
    coordl passes to torch (its plan sampler). So save the user's arguments first, as the
    wrapper of this class would have. NOTE: mirrors lightning.fabric.utilities.data
    `_wrap_init_method` (Lightning 2.6); tests/integrations run it with the real Lightning.
    """
    base = torch.utils.data.DataLoader
    if "__old__init__" not in vars(base) or "__old__init__" in vars(type(loader)) \
            or hasattr(loader, "__pl_saved_args"):
        return
    dataset = arguments.pop("dataset")
    object.__setattr__(loader, "__pl_saved_args", (dataset,))
    object.__setattr__(loader, "__pl_saved_kwargs", arguments)
    object.__setattr__(loader, "__pl_saved_arg_names", ("dataset",))
    object.__setattr__(loader, "__pl_saved_default_kwargs", {})


def _device_pool(slots: Any, device: str, dtype: torch.dtype):
    from coordl.loader.devpool import DevicePool
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
        raise ConfigError(f"device_buffers={slots!r} must be an int >= 0 (the batches' reused device buffers; "
                          "0: a new tensor for each batch)")
    return DevicePool(slots, device, dtype)


def _check_device(dataset: Any, device: Any, dtype: Any, decoder: str, backend: str, coordinator: Any):
    """(device, dtype, decoder) of DataLoader(device=...), or ConfigError naming what does not go with it."""
    if device is None:
        return None, dtype, decoder
    from coordl.pipelines import batchaug, batchdecode
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device={device!r} is not a torch device: use 'cuda', 'cuda:1' or 'cpu'") from None
    if device.type != "cuda" and device.type != "cpu":
        raise ConfigError(f"device={device!r}: batch prep runs on 'cuda' or 'cpu'")
    if backend != "cpu" or coordinator is not None:
        raise ConfigError("device= prepares batches in this process; it does not go with backend='dali' or "
                          "coordinator=: drop one of them")
    why = dataset.device_contract() if isinstance(dataset, CoordlDataset) else \
        f"{type(dataset).__name__} is not a coordl.CoordlDataset"
    if why:
        raise ConfigError(f"device={str(device)!r} needs a coordl.ImageFolder or coordl.WebDataset with "
                          f"transform='train' or 'val', or a coordl.CoordlDataset that declares transform, size "
                          f"and label(i) (docs/gpu-prep.md): {why}")
    if dtype not in batchaug.OUT_DTYPES:
        raise ConfigError(f"device_dtype={dtype!r}: use torch.uint8, torch.float32, torch.float16 or torch.bfloat16")
    if decoder not in batchdecode.DECODERS:
        raise ConfigError(f"decoder={decoder!r}: use one of {', '.join(batchdecode.DECODERS)}")
    return str(device), dtype, decoder
