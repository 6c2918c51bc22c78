"""Prep workers: the processes that decode and augment straight into the ring.

The daemon (daemon.py) owns a `WorkerPool`; each worker is a child forked
from it, so it shares the dataset's manifest pages and the ring mapping, and
talks to the daemon over its own socketpair with protocol.py frames:
PrepTask(slot, index, lo, hi) in, PrepDone / PrepFailed out. A batch is
split into one chunk of rows per worker; each worker has at most
`_MAX_IN_FLIGHT` chunks at a time, the rest wait in the pool's queue, so
chunks go to whichever worker is free and batches complete in order.

Backends (`coordl serve --backend`): "cpu" (default) runs the dataset's own
fetch -> prep -> skip loop (`ImageFolder.prep_rows`, the CPU pipeline; for a
dataset served by its sample spec, spec.py, `CoordlDataset.prep_samples`, which
checks every sample's shape and dtype against the ring's);
"dali" fetches the chunk's bytes the same way (MinIO cache, then storage,
counted alike) and decodes and augments them with one DALI pipeline per
worker (`pipelines/dali.py` `Prep`, one DALI thread, HWC straight into the
ring's rows). The pipeline is built in the worker at its first task, never
in the daemon: DALI's threads do not survive fork. Both draw each item's
crop and flip from `crop.item_rng(seed, epoch, item)`, so they crop the same
boxes; their pixels differ only by the two resamplers (see docs/gpu-prep.md and docs/dali.md).

NOTE (lifecycle of a prep worker):
- created by the daemon (`WorkerPool.start`, and `_spawn` again when one died);
  it closes every descriptor of the daemon's except its own socket;
- attaches to nothing: it inherits the ring mapping and the dataset (the
  daemon's bound copy, whose `TaskCounters` each worker has a copy of);
- with --backend dali it owns one DALI pipeline (and its thread), built at its
  first task and gone with the process (os._exit); the daemon never builds one;
- exits when its socket reaches EOF (the daemon closed it, or died);
  prctl(PR_SET_PDEATHSIG, SIGKILL) also kills it if the daemon dies by
  SIGKILL while it is decoding. It ignores SIGINT and SIGTERM (Ctrl-C in the
  daemon's terminal, systemd's stop or `kill -- -PGID` reach the whole process
  group; the daemon decides, so a shutdown is never mistaken for a death);
- on SIGKILL of a worker, the daemon sees EOF, reaps it, forks a new one and
  gives its unfinished chunks to the workers again; a chunk on which a second
  worker dies fails its batch (the holders get BatchFailed: a file that
  crashes the decoder does not kill workers for ever);
- the daemon reaps every worker at shutdown: EOF first, SIGKILL after 5 s.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from coordl.datasets import daliflow
from coordl.errors import ConfigError

from . import protocol as p
from .plan import Plan
from .ring import Ring

log = logging.getLogger("coordl.serve")
_MAX_IN_FLIGHT = 2
_PR_SET_PDEATHSIG = 1
# A finished batch, as the pool hands it to the daemon: (slot, rows kept) or (slot, why it failed).
Finished = tuple[int, int | p.Failure]


class TaskCounters:
    """The counters of the daemon's bound dataset: a prep worker's increments, per task (they
    travel to the daemon in PrepDone)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def add(self, **amounts: int) -> None:
        self.counts.update(amounts)

    def take(self) -> dict[str, int]:
        out, self.counts = dict(self.counts), collections.Counter()
        return out


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the daemon died before prctl took effect
        os._exit(1)


class DaliRows:
    """The DALI backend of one prep worker: rows of a chunk through `pipelines/dali.Prep`.

    Made in the worker after fork; the pipeline itself is built at the first chunk (and
    again after a failed build), so an error building it (no DALI, no GPU) reaches the
    jobs as that batch's error, with the fix.
    """

    def __init__(self, dataset, batch_size: int, device: str = "cpu") -> None:
        self.dataset, self.batch_size, self.device = dataset, batch_size, device
        self._prep = None

    def _pipeline(self):
        if self._prep is None:
            from coordl.pipelines import dali

            dali.require()
            device_id = None
            if self.device == "gpu":
                from coordl.pipelines.dali import gpu_count

                if gpu_count() == 0:
                    raise ConfigError("coordl serve --dali-device gpu, but DALI sees no CUDA device "
                                      "(no GPU or no NVIDIA driver): use --dali-device cpu")
                device_id = 0  # the first visible device: choose it with CUDA_VISIBLE_DEVICES
            ds = self.dataset
            recipe = dali.Recipe(ds.transform, ds.size, ds.seed, layout="HWC", device=self.device)
            self._prep = dali.Prep(recipe, self.batch_size, num_threads=1, device_id=device_id, depth=1)
        return self._prep

    def __call__(self, items, epoch: int, images, labels, ids) -> int:
        """The one DALI flow (coordl/datasets/daliflow.py), its rows straight into `images`."""
        ds = self.dataset
        prep = self._pipeline()
        raws, fetched = daliflow.fetch(ds, items)
        try:
            kept, errors = prep.prep_into(raws, fetched, epoch, images) if fetched else ([], {})
        except Exception:
            self._prep = None  # a failure Prep does not recover from itself: a new pipeline next time
            raise
        rows = daliflow.settle(ds, fetched, kept, errors)
        labels[:len(rows)] = daliflow.labels_of(ds, rows)
        ids[:len(rows)] = rows
        return len(rows)


def _file_of(dataset) -> Callable[[int], str]:
    """What names an item's file in a failure report: the manifest's path, else "<Class> item i"
    (a user's coordl.CoordlDataset has no manifest)."""
    manifest = getattr(dataset, "manifest", None)
    return manifest.path if manifest is not None else lambda i: f"{type(dataset).__name__} item {i}"


def row_maker(backend: str, dataset, batch_size: int, dali_device: str = "cpu",
              images: bool = True) -> Callable:
    """A worker's `rows(items, epoch, samples, labels, ids) -> kept` for `backend` ("cpu" or "dali");
    `images`: the ring holds uint8 (N, N, 3) images (spec.py `hwc`), else the dataset's samples."""
    if backend == "dali":
        return DaliRows(dataset, batch_size, dali_device)

    def cpu_rows(items, epoch: int, samples, labels, ids) -> int:
        return dataset.prep_rows(items, epoch, samples, labels, ids=ids)  # the one CPU loop

    def spec_rows(items, epoch: int, samples, labels, ids) -> int:
        return dataset.prep_samples(items, epoch, samples, labels, ids=ids)  # base.py: checked rows
    return cpu_rows if images else spec_rows


def _prep_task(plan: Plan, ring: Ring, task: p.PrepTask, rows_of: Callable) -> int:
    """Prepare rows lo..hi of the task's batch into its slot with `rows_of` (the backend's);
    returns how many rows were kept, from lo on."""
    items = plan.batch(task.index)[task.lo:task.hi]
    rows = slice(task.lo, task.hi)
    slot = task.slot
    return rows_of(items, plan.epoch_of(task.index), ring.samples[slot][rows],
                   ring.labels[slot][rows], ring.ids[slot][rows])


def worker_main(sock: socket.socket, dataset, plan: Plan, ring: Ring, parent: int,
                backend: str = "cpu", dali_device: str = "cpu", images: bool = True) -> None:
    """The body of a prep worker process; never returns."""
    code = 0
    try:
        _die_with_parent(parent)
        signal.set_wakeup_fd(-1)  # the daemon's wake-up socket is not ours (and is closed here)
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # the daemon decides: it closes our
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # socket (EOF) when it shuts down
        counters = dataset.counters
        rows_of = row_maker(backend, dataset, plan.batch_size, dali_device, images)  # after fork: DALI's threads
        reader = p.FrameReader(p.TO_WORKER, p.MAX_REQUEST)
        while True:
            data = sock.recv(65536)
            if not data:
                break
            for task in reader.feed(data):
                try:
                    kept = _prep_task(plan, ring, task, rows_of)
                    reply: p.Message = p.PrepDone(task.slot, task.index, task.lo, task.hi, kept,
                                                  counters.take())
                except Exception as e:  # noqa: BLE001 (travels to the jobs as data; the worker goes on)
                    counters.take()  # the failed batch's counts are dropped with it
                    reply = p.PrepFailed.of(task, p.Failure.from_exception(e, _file_of(dataset)))
                sock.sendall(reply.encode())
    except (BrokenPipeError, ConnectionResetError):
        pass
    except BaseException:
        log.exception("prep worker %d failed", os.getpid())
        code = 1
    finally:
        os._exit(code)


@dataclass
class _Worker:
    pid: int
    sock: socket.socket
    reader: p.FrameReader
    tasks: list[p.PrepTask] = field(default_factory=list)


@dataclass
class _Batch:
    index: int
    pending: int                     # chunks not yet done
    kept: dict[int, int] = field(default_factory=dict)  # chunk lo -> rows kept
    error: p.Failure | None = None   # the first failed chunk's


class WorkerPool:
    """The daemon's side of the prep workers."""

    def __init__(self, dataset, plan: Plan, ring: Ring, workers: int,
                 inherited_fds: Callable[[], list[int]],
                 forget: Callable[[socket.socket], object] = lambda sock: None,
                 backend: str = "cpu", dali_device: str = "cpu", images: bool = True) -> None:
        self.dataset, self.plan, self.ring, self.size = dataset, plan, ring, workers
        self.backend, self.dali_device = backend, dali_device  # config.py checked them
        self.images = images  # the ring holds images (spec.py hwc), else the dataset's samples
        self.inherited_fds = inherited_fds   # the daemon's descriptors a new worker must close
        self.forget = forget                 # called with a dead worker's socket before it is closed
        self.workers: dict[int, _Worker] = {}  # by socket fd
        self.queue: collections.deque[p.PrepTask] = collections.deque()
        self.batches: dict[int, _Batch] = {}   # by slot
        self.counters: collections.Counter = collections.Counter()
        self.deaths = 0
        self.retried: set[tuple[int, int, int]] = set()  # (slot, batch, lo) whose first worker died

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()

    def _spawn(self) -> _Worker:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            keep = theirs.fileno()
            for fd in [mine.fileno(), *self.inherited_fds(),
                       *(w.sock.fileno() for w in self.workers.values())]:
                if fd != keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            worker_main(theirs, self.dataset, self.plan, self.ring, parent, self.backend,
                        self.dali_device, self.images)
        theirs.close()
        worker = _Worker(pid, mine, p.FrameReader(p.FROM_WORKER, p.MAX_REPLY))
        self.workers[mine.fileno()] = worker
        return worker

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers.values()]

    def submit(self, slot: int, index: int) -> None:
        """Queue batch `index` (to be written into `slot`) as one chunk of rows per worker."""
        rows = self.plan.batch_len(index)
        step = -(-rows // max(1, self.size))
        chunks = [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]
        self.batches[slot] = _Batch(index, len(chunks))
        self.queue.extend(p.PrepTask(slot, index, lo, hi) for lo, hi in chunks)
        self.dispatch()

    def dispatch(self) -> None:
        while self.queue:
            worker = min(self.workers.values(), key=lambda w: len(w.tasks), default=None)
            if worker is None or len(worker.tasks) >= _MAX_IN_FLIGHT:
                return
            task = self.queue.popleft()
            worker.tasks.append(task)
            try:
                worker.sock.sendall(task.encode())
            except OSError:
                pass  # it died; on_readable sees EOF and fails its tasks

    def on_readable(self, fd: int) -> list[Finished]:
        """Read one worker's results: [(slot, rows kept) | (slot, its Failure)] of finished batches."""
        worker = self.workers[fd]
        try:
            data = worker.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            return self._died(worker)
        done: list[Finished] = []
        for msg in worker.reader.feed(data):
            worker.tasks = [t for t in worker.tasks if (t.slot, t.lo) != (msg.slot, msg.lo)]
            if isinstance(msg, p.PrepDone):
                self.counters.update(msg.counters)
                finished = self._chunk_done(msg.slot, msg.lo, msg.kept, None)
            else:
                finished = self._chunk_done(msg.slot, msg.lo, 0, msg.failure)
            if finished is not None:
                done.append(finished)
        self.dispatch()
        return done

    def _chunk_done(self, slot: int, lo: int, kept: int, error: p.Failure | None) -> Finished | None:
        batch = self.batches[slot]
        self.retried.discard((slot, batch.index, lo))
        batch.kept[lo] = kept
        if error is not None and batch.error is None:
            batch.error = error
        batch.pending -= 1
        if batch.pending:
            return None
        del self.batches[slot]
        if batch.error is not None:
            return slot, batch.error
        return slot, self._compact(slot, batch)

    def _compact(self, slot: int, batch: _Batch) -> int:
        """Close the gaps that skipped samples left between chunks; the valid row count."""
        row = 0
        for lo in sorted(batch.kept):
            kept = batch.kept[lo]
            if row != lo and kept:
                for arr in (self.ring.samples, self.ring.labels, self.ring.ids):
                    arr[slot, row:row + kept] = arr[slot, lo:lo + kept]
            row += kept
        return row

    def _died(self, worker: _Worker) -> list[Finished]:
        del self.workers[worker.sock.fileno()]
        self.forget(worker.sock)  # before close: its successor's socket may get the same number
        worker.sock.close()
        status = _reap(worker.pid, wait=1.0)
        self.deaths += 1
        log.error("prep worker %d died (%s); starting a new one", worker.pid, status)
        done: list[Finished] = []
        for task in reversed(worker.tasks):  # each chunk gets one more try, on another worker
            key = (task.slot, task.index, task.lo)
            if key not in self.retried:
                self.retried.add(key)
                self.queue.appendleft(task)
                continue
            reason = (f"prep worker {worker.pid} died ({status}) while preparing rows {task.lo}-"
                      f"{task.hi} of this batch, the second worker to die on them: see the daemon's log")
            finished = self._chunk_done(task.slot, task.lo, 0, p.Failure("internal", reason))
            if finished is not None:
                done.append(finished)
        self._spawn()
        self.dispatch()
        return done

    def stop(self, grace: float = 5.0) -> None:
        """Close every worker's socket (they exit on EOF), reap them, SIGKILL the slow ones."""
        workers = list(self.workers.values())
        self.workers.clear()
        for w in workers:
            w.sock.close()
        deadline = time.monotonic() + grace
        for w in workers:
            _reap(w.pid, wait=max(0.0, deadline - time.monotonic()))


def _reap(pid: int, wait: float) -> str:
    """Wait up to `wait` s for child `pid`, then SIGKILL it; how it ended, in words."""
    deadline = time.monotonic() + wait
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "already reaped"
        if done:
            if os.WIFSIGNALED(status):
                return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
            return f"exit code {os.waitstatus_to_exitcode(status)}"
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "killed after the grace period"
        time.sleep(0.01)
