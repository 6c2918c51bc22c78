"""The job's side of the coordinator (the daemon's side is daemon.py).

`coordl.DataLoader(dataset, batch_size=B, shuffle=True, coordinator="unix:///path")`
holds a `Client`: it attaches to the daemon (Hello/Welcome), maps the ring
read-only, and each ``iter(loader)`` is one `EpochIterator` (Begin, then a
Next per batch, one always sent ahead). The ring's rows are the daemon's sample
spec (spec.py, from Welcome): uint8 images, handed out as (B, 3, N, N), or a
dataset's own samples (coordl.AudioFolder's float32 (channels, samples), a
user's vectors...), handed out as (B, *shape) in their dtype. A batch is handed
out as tensors that view the ring slot, with no copy: it stays valid until the next batch is
requested, when the slot is released to the daemon (clone what you keep
longer; the views are read-only). With ``pin_memory=True`` the batch is
copied once into (pinned) memory of its own and the slot is released at once.
A job the daemon detached (straggler, shutdown) may find the slot of the
batch in its hands reused; its next call raises `CoordinatorError`.

The daemon decides a job's epochs (plan.py: its first is the first whole
epoch it joins, then one per ``iter(loader)``), so `Client.set_epoch` cannot
move a job; `Client.stats` reports what this job received and what the
daemon did for all its jobs (the ``daemon_`` keys).

Resume. `Client.state_dict` is `coordl.epochs.resume`'s state (the local loader's:
version, the daemon epoch under way, the batches of it the training loop has
*received* (a Next sent ahead is not counted), and the identity: dataset
fingerprint, items, seed, batch size, drop_last, shuffle, world size 1) plus
``"coordinator": {"start_epoch": s}``, the job's first epoch, since epochs are
counted per job. `Client.load_state_dict`, on a fresh job before its first
``iter(loader)``, checks the state (`coordl.epochs.resume.check_state`: another
dataset, seed, batch size, drop_last, shuffle or an unknown version is
refused naming the difference) and sends Resume: the job's next epoch
continues at that batch, and with ``--epochs E`` it gets exactly the epochs
it had left (E counted from ``start_epoch``). When that batch has already
left the ring (the other jobs went on, or the daemon is a new one), the
daemon *prepares it again* rather than moving the job to the next epoch
boundary: a batch is a pure function of (seed, epoch, items), so the copy
is the same bytes, and a resumed job never silently loses part of an epoch
(the failure mode resume exists to avoid). The cost is decode work: the
daemon catches the job up first, and the other jobs wait for it as for
any slow job until it has reached them (scheduler.py). Because the plan is
the local loader's, a coordinated state also resumes a local
`coordl.DataLoader` (world size 1) and a local state a coordinated job (its
first epoch then counts as 0).

Failures. A batch the daemon could not prepare arrives as BatchFailed, a
`protocol.Failure`: its kind, the item and file the prep worker was at, and
the worker's traceback. A bad item (kind "sample") raises `SampleError`
naming the file, as a local loader does; the dataset's or the settings' fault
(kind "config": a sample of another shape or dtype than the ring's) raises
`ConfigError` naming the item and the fix; anything else (a bug, a worker that
died twice on the same rows) raises `CoordinatorError` with the worker's
traceback (`failure_error`). Either way the job goes on: the next
``next(it)`` gets the batch after it.

No wait is unbounded without a check: every blocking read polls the socket
once a second and checks that the daemon process still lives, so a daemon
killed with SIGKILL makes the next call raise `CoordinatorError` within a
second or two; the DataLoader's ``timeout`` (seconds, 0: none) bounds the
wait for one batch as in torch.
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any

import torch

from coordl import names
from coordl.batch import PreparedBatch
from coordl.cache.forkguard import ForkGuard
from coordl.datasets.base import CoordlDataset, require_fingerprint
from coordl.epochs import resume
from coordl.errors import ConfigError, CoordinatorError, SampleError

from . import protocol as p
from .assemble import AssembledEpoch, Cut, OutputBuffers, Position
from .channel import _Channel, status  # noqa: F401 (status: coordl.coordinator.client.status)
from .config import parse_address
from .ring import INDEX, Layout, Ring
from .spec import SampleSpec, dataset_spec

_DAEMON_KEYS = ("storage_reads", "storage_bytes", "decodes", "samples", "errors_skipped",
                "cache_hits", "cache_misses", "cache_inserts")  # what the prep workers count
_HELLO_TIMEOUT = 30.0


class CoordinatedBatch(list[torch.Tensor]):
    """``[images, labels]`` as coordl's collate gives them, plus where they came from (`images` is
    the batch's samples whatever they are: waveforms, vectors...)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor,
                 epoch: int, index: int) -> None:
        super().__init__((images, labels))
        self.images, self.labels = images, labels
        self.indices = indices  # dataset item of each row (int64)
        self.epoch = epoch
        # global batch number at the daemon (plan.py); it shadows list.index on purpose (batch.index)
        self.index = index  # pyright: ignore[reportAttributeAccessIssue]


class Client:
    """One job attached to a coordinator daemon; see the module docstring."""

    def __init__(self, address: str | os.PathLike, dataset, batch_size: int, shuffle: bool,
                 drop_last: bool, timeout: float = 0.0) -> None:
        _check_dataset(dataset, batch_size)
        self.identity = {  # the local loader's identity keys (coordl/loader/dataloader.py _identity)
            "dataset": dataset.fingerprint, "items": len(dataset), "seed": int(dataset.seed),
            "batch_size": int(batch_size), "drop_last": bool(drop_last), "shuffle": bool(shuffle),
            "world_size": 1}
        self.path = parse_address(address)
        self.timeout = float(timeout) if timeout and timeout > 0 else None
        self._fork = ForkGuard()  # the connection is this process's; a fork may not use it
        self.channel = _Channel(self.path)
        served = dataset.served_as()  # (where, transform or class path, size: coordl/datasets/base.py)
        mine = dataset_spec(dataset, "coordinator=")  # a user's dataset: its sample_spec() (spec.py)
        try:
            self.channel.send(p.Hello(
                p.VERSION, dataset.fingerprint, served[0], len(dataset),
                served[1], served[2], int(dataset.seed), str(dataset.on_error),
                int(batch_size), bool(shuffle), bool(drop_last), os.getpid(),
                list(mine.delivered), mine.dtype))
            reply = self.channel.recv(_HELLO_TIMEOUT, "its welcome")
            if isinstance(reply, p.Refused):
                raise CoordinatorError(f"the coordinator at {self.path} refused this job: {reply.reason}")
            if not isinstance(reply, p.Welcome):
                raise CoordinatorError(f"the coordinator answered hello with {reply.TYPE!r}")
            self.welcome = reply
            self.spec = SampleSpec.from_wire(reply.sample_shape, reply.sample_dtype, reply.sample_hwc)
            self.ring = Ring.attach(reply.ring, Layout(reply.slots, reply.batch_size, self.spec.shape,
                                                       self.spec.dtype))
            # a batch size (or drop_last) of its own: batches cut from the daemon's chunks (assemble.py)
            self.cut = _cut(len(dataset), reply, int(batch_size), bool(drop_last), dataset.on_error)
        except BaseException:
            self.channel.close("attach failed")
            raise
        with warnings.catch_warnings():  # the ring is mapped read-only; so are these views
            warnings.simplefilter("ignore", UserWarning)
            self._samples = [torch.from_numpy(a) for a in self.ring.samples]
            self._labels = [torch.from_numpy(a) for a in self.ring.labels]
            self._ids = [torch.from_numpy(a) for a in self.ring.ids]
        self._held: int | None = None  # the batch handed out last (a view of its slot): released at the next send
        self._releases: list[int] = []  # batches done with (copied out): sent with the next message,
        # or at once before this job waits for the daemon (`_reply`)
        self.out = OutputBuffers()  # the memory of batches copied out of the ring (assemble.py)
        self.next_epoch = self.welcome.start_epoch  # the epoch the next iteration runs
        self.start_epoch = self.welcome.start_epoch  # the job's first epoch (a resumed one: saved)
        self._current: Position | None = None       # where the epoch under way is (for state_dict;
        # the iterator's position, not the iterator: a dropped iterator must be freed at once)
        self._resumed_at = 0  # batches of `next_epoch` received before a restart (load_state_dict)
        self.batches = self.samples = self.failed_batches = 0  # received by this job
        self._framework_epoch: EpochIterator | AssembledEpoch | None = None  # framework_batch's epoch under way
        self._finalizer = weakref.finalize(self, _Channel.close, self.channel, "the job closed it")

    # -- facts the daemon told us --
    @property
    def batches_per_epoch(self) -> int:
        """This job's batches per epoch (its own batch size's, with a `cut`)."""
        return self.cut.batches_per_epoch if self.cut is not None else self.welcome.batches_per_epoch

    @property
    def job(self) -> int:
        return self.welcome.job

    @property
    def daemon_pid(self) -> int:
        return self.channel.daemon_pid

    def __len__(self) -> int:
        return self.batches_per_epoch

    # -- iteration --
    def epoch(self, pin_memory: bool = False) -> EpochIterator | AssembledEpoch:
        """Start this job's next epoch (one ``iter(loader)``)."""
        if self.cut is not None:
            return AssembledEpoch(self, pin_memory)
        return EpochIterator(self, pin_memory)

    def _rows(self, ready: p.Ready) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(samples, labels, ids) of a Ready's slot: views, the ring's layout (images HWC)."""
        slot, n = ready.slot, ready.n
        if int(self.ring.table[slot, INDEX]) != ready.index:
            self.channel._read_leftovers()  # detached or shut down since: raises saying so
            raise CoordinatorError(f"slot {slot} holds batch {int(self.ring.table[slot, INDEX])}, "
                                   f"not {ready.index}: the ring is corrupt (please report this)")
        return self._samples[slot][:n], self._labels[slot][:n], self._ids[slot][:n]

    @staticmethod
    def _coordinated(*args: Any) -> CoordinatedBatch:
        return CoordinatedBatch(*args)

    @staticmethod
    def _failure(reply: p.BatchFailed, epoch: int) -> Exception:
        return failure_error(reply, epoch)

    def _release_later(self, index: int) -> None:
        self._releases.append(index)

    def _check_pid(self) -> None:
        if self._fork.forked():
            raise CoordinatorError(
                f"this DataLoader's coordinator connection belongs to process {self._fork.pid}, and "
                f"process {os.getpid()} (a fork) cannot share it: create the DataLoader in the "
                "process that iterates it")

    def _send(self, msgs: list[p.Message]) -> None:
        self._check_pid()
        if self._held is not None:  # the user is done with the batch handed out last
            msgs.insert(0, p.Release(self._held))
            self._held = None
        if self._releases:
            msgs[:0] = _ranges(self._releases)
            self._releases.clear()
        if msgs:
            self.channel.send(*msgs)

    def _reply(self, timeout: float | None, waiting_for: str, stale: tuple[type, ...] = ()) -> p.Message:
        """The next reply that is not of a `stale` kind; a refusal raises (and detaches)."""
        while True:
            if self._releases and not self.channel.pending:  # about to wait: let go first
                self._send([])
            reply = self.channel.recv(timeout, waiting_for)
            if isinstance(reply, p.Refused):
                self.channel._close(reply.reason)
                raise CoordinatorError(f"the coordinator refused: {reply.reason}")
            if not isinstance(reply, stale):
                return reply

    def _batch(self, ready: p.Ready, pin_memory: bool) -> CoordinatedBatch:
        samples, labels, ids = self._rows(ready)
        if pin_memory:
            samples = _copy_out(samples, self.out)
            labels, ids = labels.clone(), ids.clone()
        if self.spec.hwc:  # images: (B, N, N, 3) in the ring, (B, 3, N, N) to the job
            samples = samples.permute(0, 3, 1, 2)
        return CoordinatedBatch(samples, labels, ids, ready.epoch, ready.index)

    def framework_batch(self, indices) -> PreparedBatch:
        """The daemon's next batch, for a loader a framework re-created from ``loader.dataset``
        (Accelerate's DataLoaderShard) that asks the dataset for batches itself (the bound
        dataset's ``__getitems__`` calls this: its binding holds this client).

        The daemon decides the order (the requested indices only count the batches: the batch
        sampler of the coordinated loader has the daemon's batch size, drop_last and length);
        the batch is copied out of the ring, since such loaders fetch a batch ahead.
        """
        if torch.utils.data.get_worker_info() is not None:
            raise CoordinatorError(
                "a coordinated loader (coordinator=...) was rebuilt with worker processes by a framework "
                "(e.g. Accelerate's prepare()): the daemon prepares the batches, so build the "
                "coordl.DataLoader with num_workers=0 before handing it over")
        for _ in range(2):
            if self._framework_epoch is None:
                self._framework_epoch = self.epoch(pin_memory=True)
            try:
                batch = next(self._framework_epoch)
                break
            except StopIteration:
                self._framework_epoch = None
        else:  # pragma: no cover - an epoch of the daemon has at least one batch
            raise CoordinatorError("the coordinator sent an empty epoch")
        if len(batch.images) > len(indices):  # fewer: the daemon skipped bad items (on_error="skip")
            raise CoordinatorError(
                f"the framework asked for a batch of {len(indices)} items and the coordinator holds "
                f"{len(batch.images)}: build the loader with the daemon's --batch-size and drop_last")
        return PreparedBatch(batch.images, batch.labels, batch.indices.tolist())

    def status(self) -> dict:
        """The daemon's status (see `coordl status`), over a connection of its own."""
        return status(self.path)

    def stats(self) -> dict[str, int]:
        """What this job received (batches, samples, failed_batches) and what the daemon did
        for all its jobs together: ``daemon_`` + its storage reads, decodes, skips and cache
        counters (coordl.loader.stats.KEYS), daemon_batches prepared and, with --cache, the node-wide
        cache state (daemon_cache_bytes, daemon_cache_items, daemon_cache_capacity)."""
        out = {"batches": self.batches, "samples": self.samples,
               "failed_batches": self.failed_batches}
        st = self.status()
        out["daemon_batches"] = int(st["produced_batches"])
        for key in _DAEMON_KEYS:
            out[f"daemon_{key}"] = int(st["counters"].get(key, 0))
        for key, value in (st["cache"] or {}).items():
            out[f"daemon_{key}"] = value
        return out

    def set_epoch(self, epoch: int) -> None:
        """Accepted only when `epoch` is the one this job runs next: the daemon serves every
        job its epochs in order and cannot position one."""
        if int(epoch) != self.next_epoch:
            raise CoordinatorError(
                f"set_epoch({epoch}): a coordinated job cannot be positioned: the coordinator "
                f"serves the epochs in order and this job's next one is epoch {self.next_epoch}. "
                f"To resume at epoch {epoch}, load locally (drop coordinator=, then "
                "loader.set_epoch works), or keep the daemon's order")

    # -- resume --
    def state_dict(self) -> dict:
        """Where this job's training loop is (see the module docstring): JSON-serialisable."""
        it = self._current
        if it is not None and not it.done and it.received < it.total:  # under way, or left by a break
            epoch, batches = it.epoch, it.received
        else:
            epoch, batches = self.next_epoch, self._resumed_at
        state = resume.make_state(self.identity, epoch, batches, None)
        state["coordinator"] = {"start_epoch": int(self.start_epoch)}
        return state

    def load_state_dict(self, state: Any) -> None:
        """Continue from `state` at the next ``iter(loader)``: exactly the batches not received
        yet, re-prepared by the daemon if they have left its ring (module docstring)."""
        epoch, batches, _ = resume.check_state(state, self.identity)
        chunk = self.cut.start(batches)[0] if self.cut is not None else batches  # the daemon's unit
        extra = state.get("coordinator") or {"start_epoch": 0}  # a local loader's: from epoch 0
        start = extra.get("start_epoch") if isinstance(extra, dict) else None
        if not (isinstance(start, int) and 0 <= start <= epoch):
            raise ConfigError(f"load_state_dict: coordinator start_epoch={start!r} must be an int "
                              f"from 0 to the state's epoch {epoch}: pass what state_dict() returned")
        if self._current is not None:
            raise ConfigError("load_state_dict on a coordinated loader that has begun an epoch: the "
                              "daemon has moved this job on; build a fresh DataLoader and load the "
                              "state before its first iter(loader)")
        self._send([p.Resume(epoch, chunk, start)])
        reply = self._reply(_HELLO_TIMEOUT, "the resume of this job")
        if not isinstance(reply, p.Resumed):
            raise CoordinatorError(f"the coordinator answered resume with {reply.TYPE!r}")
        self.start_epoch, self.next_epoch = reply.start_epoch, reply.epoch
        self._resumed_at = reply.batches if self.cut is None else (batches if reply.epoch == epoch else 0)

    def close(self) -> None:
        """Detach now (every slot this job holds is released)."""
        self._finalizer()

    def _pause(self) -> None:
        """An epoch's iterator was dropped before its end (EpochIterator.__del__): tell the daemon,
        which releases what this job holds. Never raises (it runs in a finalizer): a daemon that
        is gone or a connection closed already has nothing left to hold."""
        if self._fork.forked() or not self._finalizer.alive:
            return
        self._held = None  # Pause lets go of every slot, the one in use included
        self._releases.clear()
        try:
            self.channel.send(p.Pause())
        except (OSError, CoordinatorError):
            pass


class EpochIterator:
    """One epoch of batches from the daemon.

    One Next is always sent ahead: when a batch is handed out, the request for
    the following one goes with the Release of the previous one, so the reply
    is usually waiting in the socket when the training loop asks for it and
    the loop does not wait for the daemon to be scheduled. A job so holds at
    most two slots: the batch in use and the one asked for.

    An iterator dropped before its epoch's end (a ``break``, an exception out of
    the loop) tells the daemon Pause when it is freed: the job gives up the rest
    of the epoch and holds nothing until its next ``iter(loader)``, so it never
    holds the ring against the other jobs, or against a new loader in this
    process. Nothing refers back to the iterator (the client keeps its
    `Position`), so a ``break`` frees it at once.
    """

    def __init__(self, client: Client, pin_memory: bool) -> None:
        self.client, self.pin_memory = client, pin_memory
        self.done = True  # until the epoch has started: nothing to pause
        client._send([p.Begin()])
        # An earlier iterator's Next sent ahead may still be answered: those replies come before
        # EpochStart and are stale (the daemon released what they hold when this epoch began).
        reply = client._reply(_HELLO_TIMEOUT, "the start of an epoch",
                              stale=(p.Ready, p.EndOfEpoch, p.BatchFailed))
        if not isinstance(reply, p.EpochStart):
            raise CoordinatorError(f"the coordinator answered begin with {reply.TYPE!r}")
        self.epoch, self.batches = reply.epoch, reply.batches
        received = client._resumed_at  # batches of this epoch the loop has had (state_dict)
        self.position = Position(reply.epoch, received, received + reply.batches)
        client._resumed_at, client._current = 0, self.position
        client.next_epoch = reply.epoch + 1
        self.done = False
        self._asked = False  # a Next is on its way

    @property
    def received(self) -> int:
        return self.position.received

    @property
    def total(self) -> int:
        return self.position.total

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return self.batches

    def __del__(self) -> None:
        # only the epoch under way: an iterator an iter(loader) after it replaced gave its epoch up
        if not self.done and self.client._current is self.position:
            self.done = True
            self.client._pause()

    def _end(self) -> None:
        self.done = self.position.done = True

    def __next__(self) -> CoordinatedBatch:
        if self.done:
            raise StopIteration
        client = self.client
        if not self._asked:
            client._send([p.Next()])
        reply = client._reply(client.timeout, f"a batch of epoch {self.epoch}")
        self._asked = False
        if isinstance(reply, p.EndOfEpoch):
            self._end()
            client._send([])
            raise StopIteration
        if isinstance(reply, p.BatchFailed):
            self.position.received += 1  # handed to the loop (as an error): a resume continues after it
            client.failed_batches += 1
            client._send([p.Next()])
            self._asked = True
            raise failure_error(reply, self.epoch)
        if not isinstance(reply, p.Ready):
            raise CoordinatorError(f"the coordinator answered next with {reply.TYPE!r}")
        batch = client._batch(reply, self.pin_memory)
        self.position.received += 1
        client.batches += 1
        client.samples += reply.n
        msgs: list[p.Message]
        if self.pin_memory:
            msgs = [p.Release(reply.index), p.Next()]  # copied out: the slot goes back at once
        else:
            msgs = [p.Next()]
        client._send(msgs)  # also releases the batch handed out before this one
        if not self.pin_memory:
            client._held = reply.index
        self._asked = True
        return batch


def _ranges(indices: list[int]) -> list[p.Message]:
    """Releases of `indices` (in order), one per run of consecutive batches."""
    out: list[p.Message] = []
    first = count = 0
    for i in indices:
        if count and i == first + count:
            count += 1
            continue
        if count:
            out.append(p.Release(first, count))
        first, count = i, 1
    if count:
        out.append(p.Release(first, count))
    return out


def _cut(items: int, welcome: p.Welcome, batch_size: int, drop_last: bool, on_error: str) -> Cut | None:
    """None when the job's batches are the daemon's chunks; else how to cut its own (assemble.py)."""
    daemon_drop_last = welcome.batches_per_epoch != -(-items // welcome.batch_size)
    if batch_size == welcome.batch_size and (drop_last == daemon_drop_last or items % batch_size == 0):
        return None
    if on_error != "raise":
        raise ConfigError(f"batch_size={batch_size} with on_error={on_error!r}: a job of another batch size "
                          f"than the coordinator's ({welcome.batch_size}) places samples by their plan "
                          "position, which skipped items would shift: use on_error='raise', or the "
                          f"daemon's batch size {welcome.batch_size}")
    return Cut(items, welcome.batch_size, batch_size, drop_last)


def failure_error(reply: p.BatchFailed, epoch: int) -> SampleError | ConfigError | CoordinatorError:
    """The exception a job raises for a batch the daemon could not prepare: `SampleError` for a
    bad item (its message names the file; on_error='skip' at `coordl serve` skips such items),
    `ConfigError` for the dataset's or the settings' fault (e.g. a sample of another shape than
    the ring's: the message names the item and the fix), `CoordinatorError` with the prep
    worker's traceback for anything else (a bug, a worker that died): that is not the data's
    fault, and catching SampleError must not hide it."""
    where = f"batch {reply.index} of epoch {epoch} could not be prepared by the coordinator"
    if reply.kind == "sample":
        return SampleError(f"{where}: {reply.error}")
    if reply.kind == "config":  # the dataset's or the daemon's settings: the message gives the fix
        return ConfigError(f"{where}: {reply.error}")
    at = f" at item {reply.item} ({reply.file or 'file unknown'})" if reply.item is not None else ""
    tb = (f"\n\nThe prep worker's traceback:\n{reply.traceback.rstrip()}" if reply.traceback
          else "\n\n(no traceback: see the daemon's log)")
    return CoordinatorError(f"{where}: an internal error{at}: {reply.error}. This is not a bad sample: "
                            f"please report it with the traceback below (the daemon logged it too){tb}")


_warned_no_pin = False


def _copy_out(images: torch.Tensor, out: OutputBuffers) -> torch.Tensor:
    """One copy of a slot's samples into memory of their own (reused from `out` once let go of):
    pinned when there is an accelerator."""
    global _warned_no_pin
    pin = torch.cuda.is_available()
    if not pin and not _warned_no_pin:
        _warned_no_pin = True
        warnings.warn("pin_memory=True but no accelerator is found: batches are copied out of the "
                      "coordinator's ring into ordinary memory", stacklevel=4)
    copy = out.take(tuple(images.shape), images.dtype, pin)
    copy.copy_(images)
    return copy


def _check_dataset(dataset, batch_size) -> None:
    if not isinstance(dataset, CoordlDataset):
        raise ConfigError(f"coordinator=... needs a coordl dataset (the daemon prepares its items); "
                          f"{type(dataset).__name__} is not one: use coordl.ImageFolder(root)")
    if type(dataset).served_as is CoordlDataset.served_as:  # a user's subclass: the daemon runs the same
        require_fingerprint(dataset, "coordinator=")          # class (coordl serve --dataset pkg.mod:Class)
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ConfigError(f"coordinator=... needs an integer batch_size (the daemon's "
                              f"--batch-size), got batch_size={batch_size!r}")
        return
    missing = [a for a in ("fingerprint", "root", "transform", "size", "on_error") if not hasattr(dataset, a)]
    if missing:  # a coordl dataset of another kind (the daemon opens an ImageFolder of the same root)
        raise ConfigError(f"coordinator=... needs a coordl.ImageFolder (the daemon prepares its "
                          f"items); {type(dataset).__name__} has no {', '.join(missing)}")
    size, transform = getattr(dataset, "size", None), getattr(dataset, "transform", None)  # both there
    if not isinstance(size, int):  # ImageFolder(size=(h, w)) with h != w
        raise ConfigError(f"coordinator=... serves square batches (coordl serve --size N): this "
                          f"dataset has size={size!r}; pass ImageFolder(size=<one int>), or "
                          "drop coordinator= for size=(height, width)")
    if transform not in names.TRANSFORMS:
        raise ConfigError(f"coordinator=... needs transform='train' or 'val' (the daemon runs "
                          f"them); the dataset has transform={transform!r}")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ConfigError(f"coordinator=... needs an integer batch_size (the daemon's "
                          f"--batch-size), got batch_size={batch_size!r}")


def connect(address: str | os.PathLike, dataset, batch_size, shuffle, drop_last, timeout: float,
            custom: list[str]) -> Client:
    """The `Client` of ``coordl.DataLoader(coordinator=address)``; `custom` names the DataLoader
    arguments that were given and that the daemon would ignore (sampler, batch_sampler, collate_fn)."""
    if custom:
        raise ConfigError(f"coordinator=... decides the order and the batches, so it cannot honour "
                          f"{', '.join(custom)}=: leave {' and '.join(custom)} unset, or drop "
                          "coordinator= to load locally")
    client = Client(address, dataset, batch_size, bool(shuffle), bool(drop_last), timeout)
    dataset.binding.coordinator = client  # a loader a framework re-creates from loader.dataset:
    return client                         # the dataset's __getitems__ asks `framework_batch`
