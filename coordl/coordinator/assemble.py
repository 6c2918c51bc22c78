"""A job with its own batch size (and drop_last): its batches cut from the daemon's chunks.

The daemon prepares each epoch once, in the plan's order, as *chunks* of its
--batch-size C (plan.py's batches; with --keep-last the last chunk of an epoch
is short, so the chunks cover every item). A job whose batch size B or drop_last
differs gets batch k of epoch e = the plan positions [k*B, k*B + B) of that
epoch, i.e. the same items, augmentation and labels as a local
`coordl.DataLoader(batch_size=B, drop_last=...)` over the same plan: the order
of an epoch does not depend on the batch size, and an item's augmentation is
a function of (seed, epoch, item) only. `Cut` is that arithmetic (pure);
`AssembledEpoch` copies the rows of one or more consecutive chunks into a
batch of the job's own (`OutputBuffers`: one copy per chunk piece, into memory
reused once the user has let go of a batch) and releases each chunk once its
rows are copied: with its next message, and always before it waits for the
daemon, so a job never waits holding a chunk it is done with, whatever B is,
and the ring bounds how far the fastest job runs ahead of the slowest (K
chunks: K * C samples). It asks for a batch's chunks with one Next(count), a
batch ahead; those chunks are its anyway (the daemon holds every published
chunk for each job that needs it, scheduler.py), so asking ahead holds no
more of the ring.

Resume counts samples: a state saved after k batches of B resumes at plan
position k*B, i.e. chunk k*B // C and the rows of it past k*B % C (`start`).
A chunk that failed (BatchFailed) fails every batch of this job that has rows
in it, each raising once; with on_error="skip" the chunks lose rows and the
positions would no longer be the plan's, so jobs of another batch size than
the daemon's need on_error="raise" (client.py checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from coordl.buffers import new_private, use_count
from coordl.errors import CoordinatorError

from . import protocol as p


@dataclass(frozen=True)
class Cut:
    items: int        # N
    chunk: int        # C: the daemon's --batch-size (its last chunk of an epoch may be shorter)
    batch_size: int   # B: the job's
    drop_last: bool   # the job's

    @property
    def batches_per_epoch(self) -> int:
        n, b = self.items, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def span(self, k: int) -> tuple[int, int]:
        """Plan positions [lo, hi) of the job's batch k of an epoch."""
        lo = k * self.batch_size
        return lo, min(lo + self.batch_size, self.items)

    def chunk_span(self, c: int) -> tuple[int, int]:
        """Plan positions [lo, hi) of chunk c of an epoch."""
        lo = c * self.chunk
        return lo, min(lo + self.chunk, self.items)

    def start(self, batches: int) -> tuple[int, int]:
        """After `batches` of the job's batches: (chunk to resume at, its rows already had)."""
        return divmod(self.span(batches)[0] if batches < self.batches_per_epoch else self.items, self.chunk)


@dataclass
class Position:
    """Where an epoch of a job is, for `Client.state_dict`; it outlives its iterator."""
    epoch: int
    received: int     # batches of the epoch the training loop has had
    total: int        # batches of the epoch
    done: bool = False


@dataclass
class _Chunk:
    lo: int                      # plan position of its first row
    hi: int
    index: int                   # the daemon's global batch number
    rows: tuple | None           # (samples, labels, ids) views of its slot; None: it failed
    failure: p.BatchFailed | None = None


class OutputBuffers:
    """The memory a job's batches are copied into, reused once the job has let go of a batch.

    A fresh tensor of a batch's size is fresh pages from the kernel every time (for
    224x224 images a batch of 64 is ~9.6 MB: the kernel zeroes each page and the copy takes
    a fault on each), which costs more CPU than the copy itself. So a job keeps up to
    `slots` buffers and makes a batch in one that nothing else in this process refers to
    (the storage's use count is 1: no tensor or view of an earlier batch is alive), as
    coordl/loader/devpool.py does on a device. A batch the user keeps (a list of batches, a
    framework fetching ahead) keeps its buffer; when every buffer is in use the batch gets a
    fresh tensor, counted in `misses`: memory is bounded by `slots` buffers plus what the
    user keeps. Pinned buffers (pin_memory=True with an accelerator) are kept apart.
    """

    def __init__(self, slots: int = 3) -> None:
        self.slots = slots
        self.misses = 0
        self._buffers: dict[bool, list[torch.UntypedStorage]] = {False: [], True: []}

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, pin: bool = False) -> torch.Tensor:
        """A contiguous tensor of `shape` and `dtype` to copy a batch into (its contents undefined)."""
        nbytes = math.prod(shape) * dtype.itemsize
        buffers = self._buffers[pin]
        for n, buf in enumerate(buffers):
            if use_count(buf) == 1:
                if buf.nbytes() < nbytes:  # a bigger batch than the buffer was made for
                    buffers[n] = buf = _new_buffer(nbytes, pin)
                return _view(buf, shape, dtype)
        if len(buffers) < self.slots:
            buffers.append(_new_buffer(nbytes, pin))
            return _view(buffers[-1], shape, dtype)
        self.misses += 1
        return torch.empty(shape, dtype=dtype, pin_memory=pin)


def _new_buffer(nbytes: int, pin: bool) -> torch.UntypedStorage:
    if pin:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).untyped_storage()
    return new_private(nbytes)  # in 2 MiB pages: a few dozen page faults, not thousands


def _view(buf: torch.UntypedStorage, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype).set_(buf, 0, shape)  # pyright: ignore[reportCallIssue]


class AssembledEpoch:
    """One epoch of a job whose batches are cut from the daemon's chunks (module docstring).

    Messages: a batch's chunks are asked for with one Next(count), sent as the batch before
    it is handed out (so they are usually in the socket when the loop asks), together with
    the Releases of the chunks that batch used up; the daemon answers with the chunks that
    are ready in one write. A job so sends one message and wakes about once per batch, not
    per chunk. A Release waits for the job's next message, or goes at once when the job is
    about to wait for the daemon: a job never waits holding a chunk it is done with (the
    ring may be smaller than one of its batches).
    """

    def __init__(self, client: Any, pin_memory: bool) -> None:
        """`client`: the job's coordinator/client.py `Client` (not imported: it imports this)."""
        self.client, self.pin_memory = client, pin_memory
        self.cut: Cut = client.cut  # type: ignore[assignment]  (set when this class is used)
        self.done = True
        client._send([p.Begin()])
        reply = client._reply(30.0, "the start of an epoch", stale=(p.Ready, p.EndOfEpoch, p.BatchFailed))
        if not isinstance(reply, p.EpochStart):
            raise CoordinatorError(f"the coordinator answered begin with {reply.TYPE!r}")
        self.epoch = reply.epoch
        received = client._resumed_at
        self.position = Position(reply.epoch, received, self.cut.batches_per_epoch)
        self.batches = self.cut.batches_per_epoch - received
        # the chunk the next reply brings, by its number in the epoch (resumed: the one holding the
        # plan position of the job's next batch; its rows before that are skipped as positions)
        self._next_chunk = client.welcome.batches_per_epoch - reply.batches
        self._asked = self._next_chunk  # chunks of the epoch asked for: those before this one
        self._chunks = client.welcome.batches_per_epoch  # the daemon's chunks per epoch
        client._resumed_at, client._current = 0, self.position
        client.next_epoch = reply.epoch + 1
        self._chunk: _Chunk | None = None
        self.done = False

    def __iter__(self) -> AssembledEpoch:
        return self

    def __len__(self) -> int:
        return self.batches

    def __del__(self) -> None:
        if not self.done and self.client._current is self.position:
            self.done = True
            self.client._pause()

    def _ask_through(self, k: int) -> None:
        """Ask for every chunk up to the one holding the last row of the job's batch k (with the
        Releases waiting to go, in one write)."""
        last = (self.cut.span(k)[1] - 1) // self.cut.chunk
        if last >= self._asked:
            self.client._send([p.Next(last + 1 - self._asked)])
            self._asked = last + 1

    def _fetch(self) -> _Chunk:
        """The next chunk of the epoch (asked for already), from the daemon."""
        client = self.client
        reply = client._reply(client.timeout, f"a chunk of epoch {self.epoch}")
        lo, hi = self.cut.chunk_span(self._next_chunk)
        self._next_chunk += 1
        if isinstance(reply, p.BatchFailed):
            return _Chunk(lo, hi, reply.index, None, reply)
        if not isinstance(reply, p.Ready):
            raise CoordinatorError(f"the coordinator answered next with {reply.TYPE!r} inside epoch "
                                   f"{self.epoch}, before this job's last batch")
        if reply.n != hi - lo:
            raise CoordinatorError(f"chunk {reply.index} holds {reply.n} samples, not {hi - lo}: the daemon "
                                   "skipped bad items (--on-error skip), which a job of another batch size "
                                   "cannot place; serve with --on-error raise")
        return _Chunk(lo, hi, reply.index, client._rows(reply))

    def _done_with(self, chunk: _Chunk) -> None:
        if chunk.rows is not None:
            self.client._release_later(chunk.index)
        self._chunk = None

    def __next__(self):
        """The job's next batch: a client.py `CoordinatedBatch` of its own memory."""
        if self.done or self.position.received >= self.position.total:
            self._finish()
            raise StopIteration
        k = self.position.received
        lo, hi = self.cut.span(k)
        self._ask_through(k)
        client, spec = self.client, self.client.spec
        samples = client.out.take((hi - lo, *spec.shape), getattr(torch, spec.dtype),
                                  self.pin_memory and torch.cuda.is_available())
        labels, ids = torch.empty(hi - lo, dtype=torch.int64), torch.empty(hi - lo, dtype=torch.int64)
        failure: p.BatchFailed | None = None
        pos = lo
        while pos < hi:
            chunk = self._chunk
            if chunk is None:
                chunk = self._chunk = self._fetch()
                if not chunk.lo <= pos < chunk.hi:
                    raise CoordinatorError(f"chunk {chunk.index} covers positions {chunk.lo}-{chunk.hi} of "
                                           f"epoch {self.epoch}, not {pos} (please report this)")
            take = min(hi, chunk.hi) - pos
            if chunk.rows is None:
                failure = failure or chunk.failure
            else:
                a = pos - chunk.lo
                for dst, src in zip((samples, labels, ids), chunk.rows):  # numpy copies: one thread,
                    # none of torch's OpenMP pool (which hangs in a process forked after it started)
                    dst.numpy()[pos - lo:pos - lo + take] = src.numpy()[a:a + take]
            pos += take
            if pos >= chunk.hi:
                self._done_with(chunk)
        self.position.received += 1
        if self.position.received < self.position.total:
            self._ask_through(k + 1)  # the next batch's chunks, with this one's Releases
        client._send([])  # Releases that went with no Next (the next batch lies in a chunk in hand)
        if failure is not None:
            client.failed_batches += 1
            raise client._failure(failure, self.epoch)
        client.batches += 1
        client.samples += hi - lo
        if spec.hwc:
            samples = samples.permute(0, 3, 1, 2)
        index = self.epoch * self.cut.batches_per_epoch + k  # the job's own batch number
        return client._coordinated(samples, labels, ids, self.epoch, index)

    def _finish(self) -> None:
        """The job's last batch is out: let go of what is left of the epoch (a chunk in hand, and
        with drop_last the tail no batch of it needs: asked for and released, so the daemon counts
        the epoch as had), then end it."""
        if self.done:
            return
        self.done = self.position.done = True
        client = self.client
        if self._chunk is not None:
            self._done_with(self._chunk)
        while True:
            if self._next_chunk >= self._asked:  # nothing on its way: the tail and the end
                count = max(1, self._chunks - self._asked + 1)
                client._send([p.Next(count)])
                self._asked += count
            reply = client._reply(client.timeout, f"the end of epoch {self.epoch}")
            if isinstance(reply, p.EndOfEpoch):
                client._send([])  # the tail's Releases
                return
            self._next_chunk += 1
            if isinstance(reply, p.Ready):
                client._release_later(reply.index)
