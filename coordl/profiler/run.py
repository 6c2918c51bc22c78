"""`coordl.profile`: runs the measurements (measure.py), feeds the model (stallmodel.py), returns a
`ProfileResult` (result.py).

NOTE [temporary state and its cleanup]
- MinIO segments: the profiler makes its own, private ones (``coordl-cache-profile-<pid>-...``,
  never the node-wide cache of the dataset, which it must not fill or drop), and drops each in
  a ``finally``: on success, on an error and on Ctrl-C (KeyboardInterrupt) alike. SIGTERM is
  turned into SystemExit by the CLI, so it takes the same path. SIGKILL leaves them for
  ``coordl cleanup`` (their creator is dead).
- Loader workers: each run's iterator is shut down in a ``finally`` (measure.loader_rate).
- The page cache: each run's items (each storage measurement's) are evicted before it
  (items.py: files, tar shards; nothing to evict for object storage) and every read drops the
  pages it read (the dataset bound with ``drop_page_cache=True``, as the loader reads), so the
  profile leaves them as uncached as it found them or more. A dataset the profiler cannot evict
  (a user's subclass) is said so in the result's notes and ``measured["storage"]``.

Any `coordl.CoordlDataset` works: items are read through the dataset's own fetch (never a file
path of an item), and the ingestion run's batches in memory are copies of one real batch.
"""

from __future__ import annotations

import copy
import os
import random
import resource
from collections.abc import Callable
from contextlib import ExitStack

import torch

from coordl.datasets.base import CoordlDataset, require_fingerprint
from coordl.errors import ConfigError

from . import measure, stallmodel
from .items import ItemReads
from .result import ProfileResult

WARMUP = 2
DEFAULT_STEPS = 10                  # timed steps per run when none are asked for: fewer when the dataset is small
STORAGE_SAMPLE_BYTES = 24 * 2**20   # bytes read per storage-bandwidth measurement
LATENCY_READS = 24                  # single cold reads timed for the read latency
FILL_CHUNK = 64                     # items read together (the dataset's batch read) to fill the cache


def _where(dataset) -> str:
    """The dataset as the report names it: its root (a folder, a URL, a shard pattern), else its class."""
    return str(getattr(dataset, "root", "") or type(dataset).__name__)


def fit_steps(items: int, batch_size: int, wanted: int = DEFAULT_STEPS) -> int:
    """Timed steps per run for a dataset of `items`: `wanted`, or fewer where `(steps + WARMUP) *
    batch_size` distinct items are not there (at least 1: then `profile` says what to change)."""
    return max(1, min(wanted, items // max(batch_size, 1) - WARMUP))


def _check(dataset, batch_size: int, num_workers: int, steps: int, device: str) -> torch.device:
    for name, v, lo in (("batch_size", batch_size, 1), ("num_workers", num_workers, 1), ("steps", steps, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name}={v!r} must be an int >= {lo}")
    if not isinstance(dataset, CoordlDataset):
        raise ConfigError(f"coordl.profile needs a coordl dataset (coordl.ImageFolder, or your coordl.CoordlDataset "
                          f"subclass), not {type(dataset).__name__}: build it with coordl.ImageFolder(root)")
    require_fingerprint(dataset, "coordl.profile")  # its runs read through private MinIO caches
    need = (WARMUP + steps) * batch_size
    if need > len(dataset):
        fit = len(dataset) // batch_size - WARMUP
        raise ConfigError(
            f"the dataset {_where(dataset)} has {len(dataset)} items; steps={steps} "
            f"with batch_size={batch_size} (and {WARMUP} warm-up steps) needs {need}: pass "
            + (f"steps <= {fit} (--steps)" if fit >= 1 else "a smaller batch size (--batch-size)")
            + " or a bigger dataset")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device={device!r} is not a torch device ({e}): pass 'cpu' or 'cuda'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r}: no CUDA GPU is visible here (torch.cuda.is_available() is "
                          f"False, torch {torch.__version__}): pass device='cpu' (--device cpu), or run on a "
                          "machine with a GPU and a CUDA build of torch")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: the profiler knows 'cpu' and 'cuda'")
    return dev


class _Session:
    """One profile's measurements, with every temporary cache it makes registered for dropping."""

    def __init__(self, dataset, batch_size, steps, device, progress, seed, stack: ExitStack):
        self.ds, self.batch_size, self.steps, self.progress = dataset, batch_size, steps, progress
        self.sync = measure.cuda_sync(device)
        self.rng = random.Random(seed)
        self.stack = stack
        self.storage = ItemReads(dataset)  # the dataset's own reads; what evicts its items
        self.sizes = self.storage.sizes()
        self.where = _where(dataset)
        self.total_bytes = max(int(sum(self.sizes)), 1)
        self.need = (WARMUP + steps) * batch_size

    def items(self) -> list[int]:
        return self.rng.sample(range(len(self.ds)), self.need)

    def cache(self, tag: str, capacity: int):
        from coordl.datasets.caching import MinIOCache

        c = MinIOCache(max(capacity, 1), name=f"profile-{os.getpid()}-{tag}")
        self.stack.callback(c.drop)
        c.open(self.ds.fingerprint, len(self.ds), label=f"coordl profile {self.where}")
        return c

    def run(self, workers: int, cache, train_step, desc: str, full=None) -> measure.Timed:
        """A loader run over `need` random items; those it reads from storage (`cache` is not
        the all-items cache `full`) are evicted first."""
        items = self.items()
        if cache is not full:
            self.storage.evict(items)
        return measure.loader_rate(self.ds, items, self.batch_size, workers, cache, train_step,
                                   WARMUP, self.steps, self.sync, desc, self.progress)

    def example_batch(self):
        """One real batch of `batch_size` random items as the profiled loader gives it (read from
        storage without leaving pages behind, prepared in this process)."""
        from coordl.loader.dataloader import DataLoader

        items = self.rng.sample(range(len(self.ds)), self.batch_size)
        loader = DataLoader(copy.copy(self.ds), batch_size=self.batch_size, sampler=items, num_workers=0,
                            drop_page_cache=True)
        for batch in loader:
            if measure.rows(batch):
                return batch
        raise ConfigError(f"coordl.profile: the dataset {self.where} gave no sample for items {items[:8]}"
                          f"{'...' if len(items) > 8 else ''} (on_error='skip' skipped all of them): check "
                          "that its items can be read and prepared")

    def fill_all(self, full) -> None:
        """Every item into the cache `full`, read FILL_CHUNK at a time through the dataset's batch read."""
        n = len(self.ds)
        for start in range(0, n, FILL_CHUNK):
            got = self.storage.read_many(range(start, min(n, start + FILL_CHUNK)))
            measure.fill_cache(full, n, sorted(got), got.get)

    def partial_cache(self, tag: str, fraction: float, full) -> tuple[object | None, float]:
        """A cache holding `fraction` of the dataset's bytes (random items), filled from `full`;
        (None, 0.0) for fraction 0. Returns the cache and the fraction of items it holds."""
        if fraction <= 0:
            return None, 0.0
        c = self.cache(tag, int(fraction * self.total_bytes))
        order = self.rng.sample(range(len(self.ds)), len(self.ds))
        n = measure.fill_cache(c, len(self.ds), order, lambda i: full.get(i))
        return c, n / len(self.ds)


def profile(train_step: Callable, dataset, batch_size: int = 64, num_workers: int = 2, *,
            steps: int | None = None, cache_bytes: int = 0, device: str = "cpu", validate: bool = False,
            repeats: int = 1, progress: bool = True, seed: int = 0,
            settings: dict | None = None) -> ProfileResult:
    """Profile `train_step` fed from `dataset`: rates, stall shares and what-if predictions.

    Args:
        train_step: called with one batch as the loader gives it (``[images, labels]`` for an
            ImageFolder, ``[waveforms, labels]`` for an AudioFolder); runs a training step and
            returns its loss (a tensor or number).
        dataset: any `coordl.CoordlDataset`: a `coordl.ImageFolder`, `coordl.WebDataset`,
            `coordl.AudioFolder` or your subclass (read through its own fetch; the page cache is
            dropped where its storage allows, and the result's notes say where it could not).
        batch_size, num_workers: of the loader being profiled (prep is also measured at
            a few counts up to num_workers, at most 4, and fitted between: stallmodel.measured_counts).
        steps: timed steps per measurement (after 2 warm-up steps); each measurement uses
            ``(steps + 2) * batch_size`` distinct items. None: 10, or as many as the dataset holds
            (`fit_steps`; the result's notes say so).
        cache_bytes: MinIO cache size of the profiled run (0: none, every item from storage).
        device: ``"cpu"`` or ``"cuda"``: where `train_step` runs (synchronized at the timing
            boundaries when it is a CUDA device).
        validate: also measure two configurations the model predicts (another cache size,
            another worker count) and report predicted against measured.
        repeats: rounds of every timed run (interleaved: round 1 of all, then round 2, ...);
            the median of each is kept. More rounds for a busy, noisy machine.
        progress: tqdm bars on stderr (only where stderr is a terminal).
    """
    fitted = None
    if steps is None:
        steps = fit_steps(len(dataset) if isinstance(dataset, CoordlDataset) else 0, batch_size)
        fitted = steps if steps < DEFAULT_STEPS else None
    dev = _check(dataset, batch_size, num_workers, steps, device)
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
        raise ConfigError(f"cache_bytes={cache_bytes!r} must be an int >= 0 (0: no cache)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats={repeats!r} must be an int >= 1")
    with ExitStack() as stack:
        s = _Session(dataset, batch_size, steps, dev, progress, seed, stack)
        result = _profile(s, train_step, num_workers, cache_bytes, dev, validate, settings or {}, repeats)
    if fitted is not None:
        result.notes.insert(0, fitted_steps_line(len(dataset), batch_size, fitted))
    return result


def fitted_steps_line(items: int, batch_size: int, steps: int) -> str:
    """What a profile whose steps were fitted to its dataset says about it."""
    return (f"{steps} timed steps per run, not {DEFAULT_STEPS}: the dataset's {items} items hold "
            f"({steps} + {WARMUP} warm-up) x batch {batch_size} distinct items per run; short runs are noisier "
            "(more images, a smaller --batch-size, or --repeats 3)")


def _median(runs: list[measure.Timed]) -> measure.Timed:
    """The run with the median rate (the lower middle one of an even number)."""
    return sorted(runs, key=lambda t: t.rate)[(len(runs) - 1) // 2]


def _profile(s: _Session, train_step, W: int, cache_bytes: int, dev, validate: bool,
             settings: dict, repeats: int) -> ProfileResult:
    synth = measure.synthetic_batches(s.example_batch())
    sample = _storage_sample(s)
    counts = stallmodel.measured_counts(W)
    reads = [measure.storage_bandwidth(sample, w, s.storage) for w in counts]
    latency = measure.read_latency(sample[:LATENCY_READS], s.storage)

    full = s.cache("all", s.total_bytes)
    s.fill_all(full)
    memory_bw = measure.memory_bandwidth(full, len(s.ds))
    fraction = min(cache_bytes / s.total_bytes, 1.0)
    profiled_cache, x0 = s.partial_cache("profiled", fraction, full)
    configs = []
    if validate:
        x1 = 0.5 if abs(x0 - 0.5) > 0.2 else 0.0
        w1 = W - 1 if W > 1 else W + 1
        vcache, x1 = s.partial_cache("validate", x1, full)
        configs = [(x1, W, vcache), (x0, w1, profiled_cache)]

    # every round measures everything once, so that a machine that gets busier or quieter
    # meanwhile moves all of them alike; the median of the rounds is kept
    rounds: dict[str, list[measure.Timed]] = {}
    for r in range(repeats):
        tag = f" [{r + 1}/{repeats}]" if repeats > 1 else ""
        for key, t in _one_round(s, synth, train_step, W, counts, full, profiled_cache, x0, configs, tag):
            rounds.setdefault(key, []).append(t)
    got = {key: _median(runs) for key, runs in rounds.items()}
    ingest, profiled = got["ingest"], got["profiled"]
    alone = [got[f"alone{w}"] for w in counts]
    cold = [got[f"cold{w}"] for w in counts]
    cached = [got[f"cached{w}"] for w in counts]
    for key, runs in rounds.items():
        if key.startswith(("alone", "cached")) and any(t.stats.get("storage_reads", 0) for t in runs):
            raise RuntimeError(f"an all-cached run ({key}) read items from storage")

    def fit(values) -> tuple[float, ...]:
        return stallmodel.fit_counts(counts, list(values))

    inputs = stallmodel.Inputs(
        ingestion=ingest.rate, train_cpu=ingest.cpu_self,
        prep_alone=fit(t.rate for t in alone), cached=fit(t.rate for t in cached),
        prep_cold=fit(t.rate for t in cold),
        prep_cpu=fit(t.cpu_self + t.cpu_children for t in alone),
        storage_bw=fit(bw for bw, _cpu in reads), memory_bw=memory_bw, fetch_cpu=reads[0][1],
        read_latency=latency, item_bytes=s.total_bytes / len(s.ds), cores=len(os.sched_getaffinity(0)))
    validation = [{"config": {"cache_fraction": round(x, 4), "workers": w},
                   "predicted": stallmodel.predict(inputs, x, w), "measured": got[f"validate{k}"].rate,
                   "measured_rounds": [t.rate for t in rounds[f"validate{k}"]]}
                  for k, (x, w, _c) in enumerate(configs)]
    result = ProfileResult.build(
        settings={**settings, "batch_size": s.batch_size, "workers": W, "steps": s.steps,
                  "warmup_steps": WARMUP, "repeats": repeats, "cache_bytes": cache_bytes,
                  "device": str(dev), "dataset": s.where, "items": len(s.ds),
                  "dataset_bytes": s.total_bytes},
        inputs=inputs, ingest=ingest, alone=alone, cold=cold, cached=cached, profiled=profiled, counts=counts,
        profiled_fraction=x0, validation=validation, rounds={k: [t.rate for t in v] for k, v in rounds.items()})
    result.measured.update(
        storage={"kind": s.storage.kind, "cold": s.storage.cold, "note": s.storage.note},
        rounds={key: [t.rate for t in runs] for key, runs in rounds.items()},
        cpu_cores_busy=profiled.cores_busy,
        max_rss_main_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        max_rss_worker_bytes=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    if s.storage.note:
        result.notes.append(s.storage.note)
    return result


def _one_round(s: _Session, synth, train_step, W, counts, full, profiled_cache, x0, configs, tag):
    """Each timed run once, in order: (key, Timed); the loader runs at each of `counts` workers."""
    yield "ingest", measure.train_rate(measure.cycle(synth, WARMUP + s.steps), train_step, WARMUP,
                                       s.steps, s.batch_size, s.sync, "ingestion (synthetic batches)" + tag,
                                       s.progress)
    for w in counts:
        yield f"alone{w}", s.run(w, full, None, f"prep alone, all cached, {w}w" + tag, full)
        yield f"cold{w}", s.run(w, None, None, f"prep alone, cold storage, {w}w" + tag, full)
        yield f"cached{w}", s.run(w, full, train_step, f"train, all cached, {w}w" + tag, full)
    yield "profiled", s.run(W, profiled_cache, train_step, f"train, profiled ({x0:.0%} cached), {W}w" + tag,
                            full)
    for k, (x, w, c) in enumerate(configs):
        yield f"validate{k}", s.run(w, c, train_step, f"validate: {x:.0%} cached, {w}w" + tag, full)


def _storage_sample(s: _Session) -> list[int]:
    """Enough randomly chosen items for a storage measurement of ~STORAGE_SAMPLE_BYTES."""
    n = len(s.ds)
    k = max(16, min(n, round(STORAGE_SAMPLE_BYTES / (s.total_bytes / n))))
    return s.rng.sample(range(n), min(k, n))
