"""The stall model: stall decomposition by difference and the what-if predictions. Pure.

Stall decomposition (DS-Analyzer's differential method). Three measured
training throughputs at the profiled number of workers, samples/s:

    ingestion  the train step on synthetic batches already in memory
    prep       the train step fed by the loader with every item in memory (MinIO)
    fetch      the train step fed by the loader from cold storage (the profiled cache)

Per epoch of N samples, compute = N / ingestion; prep stall = N / prep -
compute; fetch stall = N / fetch - N / prep (each clamped at 0: a difference
below the noise is no stall).

What-if model. Each of the w loader workers fetches then preps its items one
at a time; the training step consumes batches as they come (prefetching
overlaps the two). Throughput with a fraction x of the items in the cache:

    workers(x, w) = w / (t_item(w) + (1 - x) * miss_cost(w))
    storage(x, w) = max(storage_bw(w), prep_cold(w) * item_bytes) / ((1 - x) * item_bytes)
    cpu(x, w)     = cores / (train_cpu + prep_cpu(w) + (1 - x) * fetch_cpu)
    rate(x, w)    = min(ingestion, workers(x, w), storage(x, w), cpu(x, w))

    t_item(w)     = w / cached(w)   per-worker seconds per item, all cached, while training
    miss_cost(w)  = w / prep_cold(w) - w / prep_alone(w)   measured in place (see below)

The storage as a whole delivers at most storage_bw(w), measured with w
readers streaming at once. Storage is a bandwidth with a latency, not a
server that makes every read wait bytes / bandwidth: an SSD serves many reads
at once, and a throttled disk (blkio) lends a reader the bandwidth it left
unused while it was decoding. (Measured here: one worker read at the full
20 MiB/s of a throttle while it also decoded, which a server model would put
at half of that.)

miss_cost(w) is what a cold item adds to a worker's time, measured in place:
the loader alone over cold items (prep_cold) against the loader alone over
cached ones (prep_alone), at the same w. A single read timed on an idle
storage (read_latency) overstates it: here it took 0.6-0.7 ms when the reads
were 20 ms apart, 0.5 ms 2 ms apart and 0.33 ms back to back (the virtual
disk's path wakes up slowly after idleness, whether the CPU slept or spun),
and a busy loader also overlaps one worker's wait with the others' decoding,
which at w workers on fewer cores costs only the read's CPU. The in-place
difference includes all of that. It stands for the latency only when the cold
run was not held by the storage's bandwidth: when storage(0, w) is below what
the workers would reach with the idle read latency, the loader queued for
bandwidth (which storage(x, w) accounts for, and which shrinks with x), and
the idle read latency minus a cache hit's copy (item_bytes / memory_bw) is
used instead. Without prep_cold (not measured) it is that latency too.

cached(w) is the measured training throughput with every item cached: when
it is below the ingestion rate the loader set that pace, so it is the
workers' speed with the train step competing for the same CPUs. When it is at
the ingestion rate the loader had slack, and the loader-alone rate is the
workers' speed. cached, prep_alone, prep_cold, prep_cpu and storage_bw hold one value
per worker count 1..W: measured at a few counts (`measured_counts`: 1, W
and at most two between, spaced geometrically, so a profile at W = 12 or 64
times as many runs as at W = 4) and fitted between them (`fit_counts`:
linear in w, which is how a loader's rate grows until a resource binds, and
what the measured neighbours bracket when it does); above W the per-worker speed, the miss cost and the storage
bandwidth at W are carried on, so more workers than measured help until the
CPUs or the storage bind.
"""

from __future__ import annotations

from dataclasses import dataclass

# a predicted rate within this fraction of the bound counts as "stall removed"
TOLERANCE = 0.02
MAX_MEASURED_COUNTS = 4  # worker counts timed per profile, whatever W (module doc)


def measured_counts(workers: int) -> list[int]:
    """The worker counts a profile at `workers` (W) times: 1..W up to MAX_MEASURED_COUNTS, else 1,
    W and counts between them spaced geometrically (W=12: 1, 2, 5, 12)."""
    if workers <= MAX_MEASURED_COUNTS:
        return list(range(1, workers + 1))
    between = {round(workers ** (k / (MAX_MEASURED_COUNTS - 1))) for k in range(1, MAX_MEASURED_COUNTS - 1)}
    return sorted({1, workers} | between)


def fit_counts(counts: list[int], values: list[float]) -> tuple[float, ...]:
    """One value per worker count 1..max(counts) from `values` measured at `counts` (ascending,
    starting at 1): the measured ones as they are, the others linear between their neighbours."""
    if not counts or counts[0] != 1 or len(counts) != len(values) or counts != sorted(set(counts)):
        raise ValueError(f"counts {counts} must ascend from 1, one value each ({len(values)} values)")
    out: list[float] = []
    for lo, hi, a, b in zip(counts, counts[1:], values, values[1:]):
        out += [a + (b - a) * (w - lo) / (hi - lo) for w in range(lo, hi)]
    return tuple(out + [values[-1]])


@dataclass(frozen=True)
class Inputs:
    """Everything the what-if model uses; every value is measured (coordl/profiler/measure.py)."""

    ingestion: float                 # samples/s: train step on in-memory synthetic batches
    train_cpu: float                 # CPU seconds per sample of the training process, in that run
    prep_alone: tuple[float, ...]    # samples/s of the loader alone, all items cached, at 1..W workers
    cached: tuple[float, ...]        # samples/s of training with every item cached, at 1..W workers
    prep_cpu: tuple[float, ...]      # CPU seconds per sample of the loader (workers + main), at 1..W
    storage_bw: tuple[float, ...]    # bytes/s of cold reads with 1..W concurrent readers
    memory_bw: float                 # bytes/s of reads out of the MinIO cache
    read_latency: float              # seconds of one cold read of an item on an idle storage
    fetch_cpu: float                 # CPU seconds per cold read of one item (kernel and Python)
    item_bytes: float                # mean encoded bytes per item
    cores: int                       # CPUs this process may run on
    prep_cold: tuple[float, ...] = ()  # samples/s of the loader alone, every item cold, at 1..W

    def __post_init__(self) -> None:
        n = len(self.prep_alone)
        if n == 0 or not len(self.cached) == len(self.prep_cpu) == len(self.storage_bw) == n:
            raise ValueError("prep_alone, cached, prep_cpu and storage_bw need one value per worker count 1..W")
        if self.prep_cold and len(self.prep_cold) != n:
            raise ValueError("prep_cold needs one value per worker count 1..W (or none)")
        values = (self.ingestion, self.memory_bw, self.item_bytes, self.read_latency, *self.prep_alone, *self.cached,
                  *self.storage_bw, *self.prep_cold)
        if min(values) <= 0 or self.cores < 1 or min(self.train_cpu, self.fetch_cpu, *self.prep_cpu) < 0:
            raise ValueError(f"rates, bandwidths and sizes must be > 0 and CPU costs >= 0: {self}")

    @property
    def measured_workers(self) -> int:
        return len(self.prep_alone)

    def worker_speed(self, workers: int) -> float:
        """Items/s of one worker while training, all cached (see the module doc), at `workers`
        (the value at W above W)."""
        k = min(workers, self.measured_workers)
        cached = self.cached[k - 1]
        pace = cached if cached < (1 - TOLERANCE) * self.ingestion else self.prep_alone[k - 1]
        return pace / k

    def idle_miss_cost(self) -> float:
        """Seconds a cold read adds to an item by the read latency on an idle storage (less the
        copy out of the cache that a hit costs)."""
        return max(self.read_latency - self.item_bytes / self.memory_bw, 0.0)

    def miss_cost(self, workers: int) -> float:
        """Seconds a cold item adds to a worker's item at `workers` (the value at W above W): the
        in-place difference of the loader alone cold and cached, unless that cold run was held by
        the storage's bandwidth (see the module doc)."""
        if not self.miss_cost_in_place(workers):
            return self.idle_miss_cost()
        k = min(workers, self.measured_workers)
        return max(k / self.prep_cold[k - 1] - k / self.prep_alone[k - 1], 0.0)

    def miss_cost_in_place(self, workers: int) -> bool:
        """Whether miss_cost(workers) is the in-place one: the cold runs were measured and the one
        at `workers` (W above W) was not held by the storage's bandwidth."""
        if not self.prep_cold:
            return False
        k = min(workers, self.measured_workers)
        latency_bound = k / (k / self.prep_alone[k - 1] + self.idle_miss_cost())
        return self.storage_bandwidth(k) / self.item_bytes > latency_bound

    def storage_bandwidth(self, workers: int) -> float:
        """Bytes/s the storage delivers to `workers` readers (W above W): the larger of two
        measured lower bounds, the threads' cold reads (storage_bw) and what the loader alone
        got reading cold items (prep_cold x item_bytes). A throttle (blkio) gave the loader 5.5-6
        MB/s where the threads, reading back to back, got 5.0 MiB/s."""
        k = min(workers, self.measured_workers)
        got = self.prep_cold[k - 1] * self.item_bytes if self.prep_cold else 0.0
        return max(self.storage_bw[k - 1], got)

    def at(self, values: tuple[float, ...], workers: int) -> float:
        """`values` (one per worker count 1..N, measured) at `workers`; beyond N, the last."""
        return values[min(workers, len(values)) - 1]


@dataclass(frozen=True)
class Limits:
    """The three bounds of one prediction, samples/s; `rate` is the smallest."""

    ingestion: float
    workers: float
    storage: float
    cpu: float

    @property
    def rate(self) -> float:
        return min(self.ingestion, self.workers, self.storage, self.cpu)

    @property
    def bound(self) -> str:
        """'model', 'workers' (their prep and read latency), 'storage' (bandwidth) or 'cpu'."""
        return min((self.ingestion, "model"), (self.workers, "workers"), (self.storage, "storage"),
                   (self.cpu, "cpu"))[1]


def limits(inp: Inputs, cache_fraction: float, workers: int) -> Limits:
    if not 0.0 <= cache_fraction <= 1.0:
        raise ValueError(f"cache_fraction={cache_fraction} must be in [0, 1]")
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    miss = 1.0 - cache_fraction
    per_item = 1.0 / inp.worker_speed(workers) + miss * inp.miss_cost(workers)
    storage = inp.storage_bandwidth(workers) / (miss * inp.item_bytes) if miss > 0 else float("inf")
    cpu_per_sample = inp.train_cpu + inp.at(inp.prep_cpu, workers) + miss * inp.fetch_cpu
    cpu = inp.cores / cpu_per_sample if cpu_per_sample > 0 else float("inf")
    return Limits(inp.ingestion, workers / per_item, storage, cpu)


def predict(inp: Inputs, cache_fraction: float, workers: int) -> float:
    """Predicted training throughput, samples/s, with `cache_fraction` of the items cached."""
    return limits(inp, cache_fraction, workers).rate


@dataclass(frozen=True)
class Stalls:
    """One epoch split by difference; seconds per epoch and percent of the epoch."""

    epoch_s: float
    compute_s: float
    prep_stall_s: float
    fetch_stall_s: float

    @property
    def prep_stall_pct(self) -> float:
        return 100.0 * self.prep_stall_s / self.epoch_s

    @property
    def fetch_stall_pct(self) -> float:
        return 100.0 * self.fetch_stall_s / self.epoch_s

    @property
    def compute_pct(self) -> float:
        return 100.0 * self.compute_s / self.epoch_s


def decompose(n_items: int, ingestion: float, prep: float, fetch: float) -> Stalls:
    """Epoch of `n_items` from the three measured throughputs (samples/s), see the module doc."""
    if n_items < 1 or min(ingestion, prep, fetch) <= 0:
        raise ValueError("n_items and the three rates must be > 0")
    compute = n_items / ingestion
    with_prep = max(n_items / prep, compute)
    with_fetch = max(n_items / fetch, with_prep)
    return Stalls(with_fetch, compute, with_prep - compute, with_fetch - with_prep)


def predicted_stalls(inp: Inputs, n_items: int, cache_fraction: float, workers: int) -> Stalls:
    """The epoch split the model predicts at (`cache_fraction`, `workers`): compute at the ingestion
    rate, prep stall up to the all-cached prediction, fetch stall the rest."""
    return decompose(n_items, inp.ingestion, predict(inp, 1.0, workers), predict(inp, cache_fraction, workers))


def what_if_cache(inp: Inputs, workers: int, fractions: list[float]) -> list[tuple[float, float]]:
    """(cache fraction, predicted samples/s) at `workers`."""
    return [(f, predict(inp, f, workers)) for f in fractions]


def what_if_workers(inp: Inputs, cache_fraction: float, workers: list[int]) -> list[tuple[int, float]]:
    """(workers, predicted samples/s) with `cache_fraction` cached."""
    return [(w, predict(inp, cache_fraction, w)) for w in workers]


def smallest_cache(inp: Inputs, workers: int, step: float = 0.01) -> float:
    """The smallest cache fraction (on a grid of `step`) whose prediction is within TOLERANCE of
    a full cache's at `workers`: a bigger cache removes no more fetch stall."""
    best = predict(inp, 1.0, workers)
    n = round(1.0 / step)
    return next(k / n for k in range(n + 1) if predict(inp, k / n, workers) >= (1 - TOLERANCE) * best)


def fewest_workers(inp: Inputs, cache_fraction: float, max_workers: int) -> int | None:
    """The fewest workers whose prediction reaches the ingestion rate (no prep stall left)
    with `cache_fraction` cached, or None when no count up to `max_workers` does (the CPUs,
    or storage, bind first)."""
    for w in range(1, max_workers + 1):
        if predict(inp, cache_fraction, w) >= (1 - TOLERANCE) * inp.ingestion:
            return w
    return None


def plateau_workers(inp: Inputs, cache_fraction: float, max_workers: int) -> int:
    """The fewest workers within TOLERANCE of the best prediction up to `max_workers`."""
    rates = [predict(inp, cache_fraction, w) for w in range(1, max_workers + 1)]
    best = max(rates)
    return next(w for w, r in enumerate(rates, 1) if r >= (1 - TOLERANCE) * best)
