"""The profiler's measurements: each one a timed run that returns numbers, nothing assumed.

- `train_rate`: the train step over any iterable of batches (synthetic ones in
  memory, or a loader); warm-up steps are excluded from the timing, and on a
  CUDA device `torch.cuda.synchronize()` closes the warm-up and the run.
- `loader_rate`: a `coordl.DataLoader` over a given list of items, with or
  without the train step. The workers' CPU per sample is their CPU from the
  first batch to the last (each live worker's process CPU clock, ns; else
  ``/proc/<pid>/stat`` in clock ticks) over the items they decoded meanwhile
  (the loader's live ``decodes`` counter), so that their start (copy-on-write
  faults of a forked training process: over whole runs, ``RUSAGE_CHILDREN``
  put it 1-12% higher here) does not count. Not from the end of the warm-up:
  the workers prefetch, and with few timed steps they had decoded most or all
  items by then, so a handful of decodes (or none, and the whole-run fallback)
  carried the clock-tick error: 2.66 ms an item where 1.3 ms was true, and
  "cores busy" above the machine's cores. ``RUSAGE_CHILDREN`` over the whole
  run is the fallback where neither clock can be read.
- cores busy: the CPU seconds of the training process and its workers over
  the timed steps over the timed seconds, both read inside the timed interval,
  so it does not exceed the cores (a per-sample CPU times the rate did, when the
  per-sample CPU was off). Over a window of a few milliseconds (a handful of
  synthetic batches) it can: the kernel's process-wide CPU clock of another
  process may count a thread's slice up to a scheduler tick late, so a window
  shorter than a few ticks reads up to a tick per process too much: such a
  reading is reported as the cores available, the most that can be true.
- `synthetic_batches`: batches in memory exactly like the loader's (one real
  batch's structure, shapes, dtypes and memory layout; its rows reordered), so
  the ingestion run assumes nothing about images, audio or a user's samples.
- `storage_bandwidth`: cold reads of items by 1..W threads through the dataset's
  own fetch (items.py `ItemReads`); the items' pages are dropped before
  (``posix_fadvise(DONTNEED)``, no root needed, where the storage allows it) and
  after each read. `read_latency`: single cold reads, spaced out.
- `memory_bandwidth`: copies of every item out of the MinIO cache.
"""

from __future__ import annotations

import copy
import math
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from tqdm import tqdm

from coordl.errors import ConfigError

from .items import ItemReads


class TrainStepError(ConfigError):
    """The train step raised, or returned nothing the profiler can use."""


@dataclass(frozen=True)
class Timed:
    """One measured run: `samples` in `seconds` (warm-up excluded); CPU seconds of this process
    over the timed steps per sample, and of the loader workers per item they decoded (see the
    module doc); `stats` are the loader's counters (empty without a loader); `cores_busy`: CPU
    seconds of this process and its workers over the timed steps per timed second (nan where
    the workers' CPU could not be read)."""

    samples: int
    seconds: float
    cpu_self: float
    cpu_children: float
    stats: dict
    cores_busy: float = math.nan
    batches: int = 0  # timed batches (warm-up excluded)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds


def bars_shown(progress: bool) -> bool:
    """Progress bars only where asked and stderr is a terminal: in a log file (or a pipe) a bar's
    redraws are noise that buries the lines printed between them."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(progress) and callable(isatty) and bool(isatty())


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def cuda_sync(device: torch.device) -> Callable[[], None]:
    """What closes a timed interval: torch.cuda.synchronize on a CUDA device, else nothing."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def check_output(out) -> None:
    """A train step must return its loss (a tensor or a number) so a step is known to have run."""
    if isinstance(out, torch.Tensor) and out.numel() > 0:
        return
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return
    raise TrainStepError(
        f"the train step returned {type(out).__name__} ({out!r:.60}), not its loss: make it return "
        "the loss tensor (e.g. `return loss.detach()`), so the profiler times steps that ran")


def describe(batch) -> str:
    """A batch's structure with each tensor's dtype and shape: ``[uint8 (4, 3, 32, 32), int64 (4,)]``."""
    if isinstance(batch, torch.Tensor):
        return f"{str(batch.dtype).removeprefix('torch.')} {tuple(batch.shape)}"
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in batch.items()) + "}"
    if isinstance(batch, (list, tuple)):
        inner = ", ".join(describe(v) for v in batch)
        return f"[{inner}]" if isinstance(batch, list) else f"({inner})"
    return type(batch).__name__


def rows(batch) -> int | None:
    """The samples in a batch: the first dimension of its first tensor (None: no tensor in it)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for v in values:
        n = rows(v)
        if n is not None:
            return n
    return None


def _call(train_step: Callable, batch, first: bool):
    try:
        out = train_step(batch)
    except TrainStepError:
        raise
    except Exception as e:
        raise TrainStepError(
            f"the train step raised {type(e).__name__}: {e} (on a batch {describe(batch)}): fix the "
            "model or train step so it runs on the loader's batches (that structure, those dtypes and "
            "shapes), or pick a built-in one (--model)") from e
    if first:
        check_output(out)
    return out


def process_cpu(pid: int) -> float | None:
    """CPU seconds so far of process `pid` (every thread): its process CPU clock (Linux
    ``clock_getcpuclockid``: ``(~pid << 3) | 2``, ns), else ``/proc/<pid>/stat`` (clock ticks);
    None where neither can be read (the process is gone, or no /proc)."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except (OSError, OverflowError, AttributeError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (14, 15)
    except (OSError, ValueError, IndexError):
        return None


def workers_cpu(it, counters: Callable[[], dict] | None = None) -> tuple[float, int] | None:
    """(CPU seconds so far of the live worker processes of loader iterator `it` (torch's
    ``_workers``; `process_cpu`), items decoded so far by `counters()`'s ``decodes``, 0
    without it); None where the CPU cannot be read."""
    workers = getattr(it, "_workers", None)
    if not workers:
        return None
    total = 0.0
    for p in workers:
        pid = getattr(p, "pid", None)
        cpu = process_cpu(pid) if pid else None
        if cpu is None:
            return None
        total += cpu
    return total, (counters()["decodes"] if counters is not None else 0)


def train_rate(batches: Iterable, train_step: Callable | None, warmup: int, steps: int,
               batch_size: int, sync: Callable[[], None], desc: str, progress: bool,
               children: Callable[[], tuple[float, int] | None] | None = None) -> Timed:
    """Time `steps` batches after `warmup` of them; `train_step` None: only take the batches.
    `children` ((CPU seconds of the loader's workers, items they prepared) so far, or None) is
    read when the first batch has come, at the start of the timed steps and at their end; the
    Timed's cpu_children is then CPU per item prepared from the first batch on (nan where it
    returned None or no item was prepared; 0 without `children`), and its cores_busy counts the
    workers' CPU over the timed steps."""
    bar = tqdm(total=warmup + steps, desc=desc, leave=False, disable=not bars_shown(progress), unit="step")
    t0 = c0 = w0 = w1 = first = None
    samples = k = 0
    try:
        for k, batch in enumerate(batches):
            if k == 0 and children is not None:
                first = children()
            if k == warmup:
                sync()
                # the wall clock first, the CPU clocks after: the CPU interval lies inside the wall one
                t0 = time.perf_counter()
                c0 = time.process_time()  # ns, every thread (getrusage's split can lag by a tick)
                w0 = children() if children is not None else None
            if train_step is not None:
                _call(train_step, batch, first=k == 0)
            if k >= warmup:
                n = rows(batch)
                samples += batch_size if n is None else n
            bar.update()
            if k + 1 == warmup + steps:
                break
        sync()
        c1 = time.process_time()
        w1 = children() if children is not None and t0 is not None else None
        t1 = time.perf_counter()
    finally:
        bar.close()
    if t0 is None or c0 is None or k + 1 < warmup + steps:
        raise ConfigError(f"{desc}: only {k + 1} batches came, {warmup + steps} were needed: "
                          "pass a smaller --steps or --batch-size")
    busy = (c1 - c0) / (t1 - t0)
    if children is None:
        workers = 0.0
    else:  # nan: the workers' CPU could not be read (loader_rate falls back to RUSAGE_CHILDREN)
        workers = math.nan
        if first is not None and w1 is not None and w1[1] > first[1]:
            workers = (w1[0] - first[0]) / (w1[1] - first[1])
        busy = busy + (w1[0] - w0[0]) / (t1 - t0) if w0 is not None and w1 is not None else math.nan
    # more than the cores is the process clocks' tick error over a window of a few ms (module doc)
    busy = min(busy, float(len(os.sched_getaffinity(0)))) if busy == busy else busy
    return Timed(samples, t1 - t0, (c1 - c0) / samples, workers, {}, busy, steps)


def synthetic_batches(example, n: int = 2, seed: int = 0) -> list:
    """`n` batches in memory like `example` (one real batch the loader gave): the same structure
    (lists, tuples, dicts), every tensor of the same shape, dtype and memory layout (channels_last
    images stay so), its rows in a random order per batch. Values are real ones, so labels are
    valid classes and a float waveform or a user's field is what the model gets in training."""
    g = torch.Generator().manual_seed(seed)
    size = rows(example)
    out = []
    for _ in range(n):
        order = torch.randperm(size, generator=g) if size else None
        out.append(_reordered(example, order))
    return out


def _reordered(x, order: torch.Tensor | None):
    if isinstance(x, torch.Tensor):
        y = torch.empty_like(x)  # strides preserved (torch.preserve_format)
        y.copy_(x[order] if order is not None and x.dim() and x.shape[0] == len(order) else x)
        return y
    if isinstance(x, dict):
        return {k: _reordered(v, order) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
        return type(x)(*(_reordered(v, order) for v in x))
    if isinstance(x, (list, tuple)):
        items = [_reordered(v, order) for v in x]
        return items if isinstance(x, list) else tuple(items)
    return copy.deepcopy(x)


def cycle(items: list, n: int) -> Iterable:
    for k in range(n):
        yield items[k % len(items)]


def loader_rate(dataset, items: list[int], batch_size: int, workers: int, cache, train_step,
                warmup: int, steps: int, sync, desc: str, progress: bool) -> Timed:
    """A fresh `coordl.DataLoader` over `items` (a copy of `dataset`, so the user's object keeps
    its state); cache=None reads storage without leaving pages in the page cache."""
    from coordl.loader.dataloader import DataLoader

    ds = copy.copy(dataset)
    kw = {"cache": cache} if cache is not None else {"drop_page_cache": True}
    children0 = _cpu(resource.RUSAGE_CHILDREN)
    loader = DataLoader(ds, batch_size=batch_size, sampler=items, num_workers=workers,
                        cache=kw.get("cache"), drop_page_cache=kw.get("drop_page_cache"))
    it = iter(loader)
    try:
        timed = train_rate(it, train_step, warmup, steps, batch_size, sync, desc, progress,
                           children=lambda it=it: workers_cpu(it, loader.stats))
        for _ in it:  # the rest of `items` (none when len(items) == (warmup + steps) * batch)
            pass
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del it
    children = timed.cpu_children if not math.isnan(timed.cpu_children) else \
        (_cpu(resource.RUSAGE_CHILDREN) - children0) / len(items)
    return Timed(timed.samples, timed.seconds, timed.cpu_self, children, loader.stats(), timed.cores_busy,
                 timed.batches)


def storage_bandwidth(items: list[int], readers: int, storage: ItemReads) -> tuple[float, float]:
    """(bytes/s, CPU seconds per item) of cold reads of `items`, one item a read, by `readers`
    threads at once (`storage`: the dataset's reads, items.py)."""
    storage.evict(items)
    c0 = _cpu(resource.RUSAGE_SELF)
    total = 0
    lock = threading.Lock()

    def read(i: int) -> None:
        nonlocal total
        n = len(storage.read(i) or b"")
        with lock:
            total += n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=readers) as pool:
        list(pool.map(read, items))
    return total / (time.perf_counter() - t0), (_cpu(resource.RUSAGE_SELF) - c0) / len(items)


def read_latency(items: list[int], storage: ItemReads, gap: float = 0.02) -> float:
    """Median seconds of one cold read of an item, the reads `gap` seconds apart (an idle storage)."""
    storage.evict(items)
    times = []
    for i in items:
        time.sleep(gap)
        t0 = time.perf_counter()
        storage.read(i)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def fill_cache(cache, n_items: int, order: Iterable[int], read: Callable[[int], bytes | None]) -> int:
    """Offer items in `order` until one no longer fits; the number admitted. An item `read` gives
    None for (it could not be read) is passed over."""
    admitted = 0
    for i in order:
        raw = read(i)
        if raw is None:
            continue
        if not cache.put(i, raw):
            if cache.get(i) is None:
                break
        else:
            admitted += 1
    return admitted


def memory_bandwidth(cache, n_items: int, repeats: int = 3) -> float:
    """bytes/s of copying every cached item out of the MinIO cache (best of `repeats`)."""
    best = math.inf
    total = 0
    for _ in range(repeats):
        total = 0
        t0 = time.perf_counter()
        for i in range(n_items):
            view = cache.get(i)
            if view is not None:
                total += len(bytes(view))
        best = min(best, time.perf_counter() - t0)
    return total / best
