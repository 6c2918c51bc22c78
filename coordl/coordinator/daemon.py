"""The coordinator daemon (`coordl serve`): prepares each batch once for many jobs.

One process, one thread, one `selectors` loop over: the listening Unix
socket, one socket per connected job (or `coordl status`), one socketpair per
prep worker (workers.py) and a wake-up socket for signals. The rules of who
gets what live in scheduler.py; this module only moves messages and owns
processes and segments. The job's side is client.py.

Connections. The daemon keeps at most `_MAX_CONNECTIONS` open. A connection
must attach as a job (Hello) or ask for its status within --hello-timeout
seconds, else it is told so and closed. When the limit is reached, the
oldest connection that has not attached is told the limit and closed to make
room, so idle connections can never lock real jobs out; only when every
connection is an attached job is the newcomer refused, in words. An error
while handling one connection's message closes that connection only (its
job is detached, the error is logged); the daemon goes on serving the rest.

NOTE (lifecycle of every process and segment):
- daemon: started by `coordl serve` (with --detach: a double fork, setsid,
  output to <socket>.log). SIGTERM/SIGINT: it tells every job ShuttingDown,
  closes their sockets, removes its socket file, closes the workers' sockets
  and reaps them (SIGKILL after 5 s), then unlinks the ring. With --epochs it
  also stops by itself once a group of jobs has started and every job has
  left having had its --epochs; a job that left with epochs to go (preempted,
  to resume from its checkpoint) is waited for up to --linger seconds
  (scheduler.py `finished`). SIGKILL: the kernel closes
  every socket, so jobs see EOF at their next read and raise
  CoordinatorError; workers die by PR_SET_PDEATHSIG (or at EOF); the ring
  segment and the socket file stay behind until `coordl cleanup`
  (cleanup.py) removes them, which it does only once the daemon (pid +
  start time in the name) is gone.
- prep workers: see workers.py.
- ring segment ``coordl-serve-<pid>-<start>-<fingerprint12>-ring`` in
  /dev/shm (ring.py, segments.py): created by the daemon, mode 0600, before
  it listens; mapped read-write by the daemon and (inherited) by its
  workers, read-only by jobs; unlinked only by the daemon at shutdown (or by
  `coordl cleanup` after its death). Jobs keep their mapping after the
  unlink, so tensors they hold stay readable; the memory goes back when the
  last mapping closes.
- socket file: created by the daemon with mode 0600 (umask 0177 around
  bind), in a folder it creates with mode 0700; removed at shutdown if it is
  still the daemon's own (same inode); a stale one (nobody accepts) is
  replaced by the next daemon or removed by `coordl cleanup`.
- job: attaches with Hello, detaches with Bye, by closing its socket, or by
  dying (SIGKILL included: the kernel closes the socket, the daemon sees EOF
  and releases its holds at once). A job detached as a straggler gets
  Detached and its socket closed; its next call raises CoordinatorError.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from coordl.cache import shm
from coordl.errors import CoordinatorError

from . import protocol as p
from . import segments
from .config import ServeConfig, private_dir
from .hello import mismatch
from .plan import Plan
from .ring import Layout, Ring, SlotTable
from .scheduler import Job, Scheduler
from .spec import served_spec
from .workers import TaskCounters, WorkerPool

# what signal.signal returns and takes back (typeshed's signal._HANDLER)
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

log = logging.getLogger("coordl.serve")
_MAX_CONNECTIONS = 512  # open connections (jobs, status requests, not yet attached)
_MAX_OUTBUF = 8 * 2**20
_TICK = 0.25


@dataclass
class _Conn:
    sock: socket.socket
    peer_pid: int
    reader: p.FrameReader = field(default_factory=lambda: p.FrameReader(p.TO_DAEMON, p.MAX_REQUEST))
    out: bytearray = field(default_factory=bytearray)
    job: int | None = None
    deadline: float | None = None  # monotonic time by which it must attach (None: attached)
    closing: bool = False
    writing: bool = False    # registered for EVENT_WRITE (replies wait in `out`)
    received: int = 0        # messages read from it
    writes: int = 0          # writes of replies to it (a turn's replies go in one)


class Daemon:
    """`Daemon(config).run()` serves until stopped; see the module docstring."""

    def __init__(self, config: ServeConfig) -> None:
        from coordl.datasets.base import describe, require_fingerprint
        from coordl.datasets.caching import cache_for

        self.config = config
        folder = served_dataset(config)
        what = f"coordl serve --dataset {config.dataset}" if config.dataset else f"coordl serve --data {config.data}"
        require_fingerprint(folder, what)
        self.served = folder.served_as()  # (where, transform or class path, size) as Hellos name it
        if config.dataset:  # a user's class: named with the arguments it was built with
            self.served = (describe(folder, config.dataset_args or {}), *self.served[1:])
        # what one ring row holds (spec.py): images, or the dataset's samples (item 0 prepared once)
        self.spec = served_spec(folder, config.size if config.dataset else config.image_size, what)
        self.cache = cache_for(folder, config.cache_bytes) if config.cache_bytes else None
        # the prep workers' view: counted per task, read through the cache without page cache
        self.dataset = folder.bind(counters=TaskCounters(), cache=self.cache,
                                   drop_page_cache=self.cache is not None)
        self.plan = Plan(len(self.dataset), config.batch_size, config.seed, config.shuffle,
                         config.drop_last, config.epochs)
        self.layout = Layout(config.slots, config.batch_size, self.spec.shape, self.spec.dtype)
        self.socket_path = config.socket
        self.conns: dict[int, _Conn] = {}
        self._unflushed: dict[int, _Conn] = {}  # connections with replies queued this turn (by id)
        self.stop_reason: str | None = None
        self.detached = 0
        self.started_at = time.monotonic()
        self.produced_batches = self.produced_images = 0
        self._rate = collections.deque([(self.started_at, 0)], maxlen=64)
        self._signal = 0
        self.ring: Ring | None = None
        self.pool: WorkerPool | None = None
        self.listener: socket.socket | None = None
        self._socket_inode: int | None = None
        self.sel = selectors.DefaultSelector()

    # -- start and stop --
    def run(self, ready: Callable[[Daemon], None] | None = None, private_fds: tuple[int, ...] = ()) -> None:
        """Serve until SIGTERM/SIGINT or, with --epochs, until done. Returns when it stopped as
        told; raises, after the same cleanup, when serving failed. `ready` is called once it
        listens; `private_fds` are descriptors the prep workers must not inherit."""
        old_handlers: dict[int, _Handler] = {}
        wake_r, wake_w = socket.socketpair()
        try:
            wake_r.setblocking(False)
            wake_w.setblocking(False)
            signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
            for sig in (signal.SIGTERM, signal.SIGINT):
                old_handlers[sig] = signal.signal(sig, self._on_signal)
            self.sel.register(wake_r, selectors.EVENT_READ, self._on_wake)
            self._start(extra_fds=[wake_r.fileno(), wake_w.fileno(), *private_fds])
            if ready is not None:
                ready(self)
            self._loop()
        finally:
            # shut down while our handlers still catch SIGTERM/SIGINT: a signal that arrives
            # now (a supervisor stopping a daemon that is already stopping by itself, after
            # --epochs) only sets _signal; with the old (default) handlers back it would kill
            # the daemon before it unlinks its ring
            try:
                self._shutdown(self.stop_reason or "the daemon failed")
            finally:
                signal.set_wakeup_fd(-1)
                for sig, handler in old_handlers.items():
                    signal.signal(sig, handler)
                wake_r.close()
                wake_w.close()

    def _on_signal(self, signum, frame) -> None:
        self._signal = signum

    def _on_wake(self, sock, _events) -> None:
        try:
            while sock.recv(4096):
                pass
        except BlockingIOError:
            pass
        if self._signal:
            self.stop(f"received {signal.Signals(self._signal).name}")

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def _start(self, extra_fds: list[int]) -> None:
        private_dir(self.socket_path)
        _refuse_live_socket(self.socket_path)
        name = f"{segments.daemon_prefix()}{self.dataset.fingerprint[:12]}-ring"
        self.ring = Ring.create(name, self.layout, self.socket_path)
        self.slots = SlotTable(self.layout.slots, self.ring.table)
        self.scheduler = Scheduler(self.plan, self.slots, self.config.min_jobs,
                                   self.config.join_window)
        self.pool = WorkerPool(self.dataset, self.plan, self.ring, self.config.workers,
                               lambda: [*extra_fds, *self._own_fds()], forget=self.sel.unregister,
                               backend=self.config.backend, dali_device=self.config.dali_device,
                               images=self.spec.hwc)
        # What is alive now (torch, the dataset, the manifest) lives as long as the daemon: out of
        # the cyclic GC's sight, so a full collection does not walk it again and again while
        # serving (one took ~0.08 s with torch imported), and the forked workers' collections
        # do not touch, and so copy, the pages they share with the daemon.
        gc.freeze()
        self.pool.start()
        self._sync_workers()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        self._socket_inode = os.stat(self.socket_path).st_ino
        listener.listen(socket.SOMAXCONN)
        listener.setblocking(False)
        self.listener = listener
        self.sel.register(listener, selectors.EVENT_READ, self._on_accept)
        log.info("pid %d serving %s (%d items, fingerprint %s, samples %s) on %s: batch %d, %d slots "
                 "(%.0f MiB), %d workers, epochs per job %s, join window %g s", os.getpid(),
                 p.printable(self.served[0]), len(self.dataset), self.dataset.fingerprint[:12],
                 self.spec.describe(), p.printable(self.socket_path), self.plan.batch_size, self.layout.slots,
                 self.layout.total_bytes / 2**20, self.config.workers,
                 self.plan.epochs or "unlimited", self.config.join_window)

    def _own_fds(self) -> list[int]:
        fds = [self.sel.fileno() if hasattr(self.sel, "fileno") else -1]
        if self.listener is not None:
            fds.append(self.listener.fileno())
        fds.extend(self.conns)
        return [fd for fd in fds if fd >= 0]

    def _shutdown(self, reason: str) -> None:
        log.info("shutting down: %s", reason)
        for conn in list(self.conns.values()):
            if conn.job is not None:
                self._send(conn, p.ShuttingDown(f"the coordinator (pid {os.getpid()}) is shutting "
                                                f"down: {reason}"))
            self._close(conn, f"the daemon shut down: {reason}")
        if self.listener is not None:
            self.listener.close()
            try:
                if os.stat(self.socket_path).st_ino == self._socket_inode:
                    os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        if self.pool is not None:
            self.pool.stop()
        if self.ring is not None:
            self.ring.unlink()
            self.ring.close()
        if self.cache is not None:
            self.cache.close()  # detach; the cache stays on the node for the next daemon
        self.sel.close()

    # -- the loop --
    def _loop(self) -> None:
        next_tick = 0.0
        while self.stop_reason is None:
            for key, events in self.sel.select(_TICK):
                key.data(key.fileobj, events)
                if self.stop_reason is not None:
                    return
            now = time.monotonic()
            self._deliver(self.scheduler.tick(now))  # the join window closes here
            self._produce()
            if now >= next_tick:
                next_tick = now + _TICK
                self._tick(now)
            self._flush_all()

    def _deliver(self, replies: list[tuple[int, p.Message]]) -> None:
        for job_id, msg in replies:
            conn = self._conn_of(job_id)
            if conn is not None:
                self._send(conn, msg)

    def _tick(self, now: float) -> None:
        for job_id in self.scheduler.stragglers(now, self.config.straggler_timeout):
            conn = self._conn_of(job_id)
            reason = (f"detached by the coordinator as a straggler: this job held the oldest batch "
                      f"of a full ring for more than --straggler-timeout "
                      f"{self.config.straggler_timeout:g} s while other jobs waited")
            if conn is not None:
                self._send(conn, p.Detached(reason))
                self._close(conn, "straggler: held the ring past --straggler-timeout")
        for conn in [c for c in self.conns.values() if c.deadline is not None and now > c.deadline]:
            self._send(conn, p.Refused(
                f"this connection did not attach as a job (hello) within --hello-timeout "
                f"{self.config.hello_timeout:g} s, so the coordinator closed it"))
            self._close(conn, None)
        if now - self._rate[-1][0] >= 1.0:
            self._rate.append((now, self.produced_images))
        if self.scheduler.finished(now, self.config.linger):
            self.stop(f"every job has had its {self.plan.epochs} epochs and left" if not self.scheduler.owed
                      else f"no job resumed within --linger {self.config.linger:g} s after "
                           f"{self.scheduler.owed} left with epochs to go")

    def _running(self) -> tuple[Ring, WorkerPool]:
        """The ring and the prep workers, which _start makes before the loop serves anything."""
        if self.ring is None or self.pool is None:
            raise CoordinatorError("the coordinator daemon is not running (no ring or prep workers yet): "
                                   "Daemon.run() starts them before it serves")
        return self.ring, self.pool

    def _produce(self) -> None:
        now = time.monotonic()
        pool = self._running()[1]
        while (claim := self.scheduler.to_prepare(now)) is not None:
            pool.submit(*claim)

    # -- workers --
    def _sync_workers(self) -> None:
        registered = {k.fd for k in self.sel.get_map().values() if k.data == self._on_worker}
        for fd, worker in self._running()[1].workers.items():
            if fd not in registered:
                self.sel.register(worker.sock, selectors.EVENT_READ, self._on_worker)

    def _on_worker(self, sock, _events) -> None:
        if self._signal:  # told to stop: an EOF now is the shutdown reaching the workers, not a
            self.stop(f"received {signal.Signals(self._signal).name}")  # death to repair
            return
        try:
            finished = self._running()[1].on_readable(sock.fileno())
        except p.ProtocolError as e:  # our own child sent garbage: a bug, but do not hang
            raise CoordinatorError(f"prep worker sent a bad message: {e}") from None
        self._sync_workers()  # a worker that died was replaced
        for slot, outcome in finished:
            if not isinstance(outcome, p.Failure):  # the rows kept
                rows = outcome
                self.produced_batches += 1
                self.produced_images += rows
                self._deliver(self.scheduler.published(slot, rows))
            else:
                error = outcome
                log.error("batch %d failed: %s%s", self.slots.index[slot], p.printable(error.error),
                          f"\n{error.traceback}" if error.kind == "internal" else "")
                self._deliver(self.scheduler.failed(slot, error))

    # -- connections --
    def _on_accept(self, listener, _events) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: refuse this one, keep serving
                log.warning("accept failed: %s", e)
                return
            try:
                self._admit(sock)
            except Exception:  # noqa: BLE001 (one connection's failure; the daemon goes on)
                log.exception("accepting a connection failed; it is closed")
                sock.close()

    def _admit(self, sock: socket.socket) -> None:
        pid, uid, _gid = p.peer_credentials(sock)
        sock.setblocking(False)
        conn = _Conn(sock, pid, deadline=time.monotonic() + self.config.hello_timeout)
        if uid != os.getuid():
            return self._refuse_now(conn, f"the coordinator runs as uid {os.getuid()} and serves "
                                          f"only its own user's jobs, not uid {uid}")
        if len(self.conns) >= _MAX_CONNECTIONS:
            idle = [c for c in self.conns.values() if c.job is None]
            if not idle:
                return self._refuse_now(conn, self._limit_text(
                    "every one of them is an attached job, so this one is refused: wait for a "
                    "job to finish, or start another daemon (coordl serve --socket OTHER)"))
            oldest = min(idle, key=lambda c: c.deadline or 0.0)
            self._send(oldest, p.Refused(self._limit_text(
                "this connection, the oldest that had not attached as a job, was closed to make "
                "room: connect again and say hello at once")))
            self._close(oldest, None)
        self.conns[sock.fileno()] = conn
        self.sel.register(sock, selectors.EVENT_READ, self._on_conn)

    def _limit_text(self, what: str) -> str:
        return (f"the coordinator (pid {os.getpid()}) keeps at most {_MAX_CONNECTIONS} connections "
                f"open and had {len(self.conns)}: {what}")

    def _refuse_now(self, conn: _Conn, reason: str) -> None:
        """Tell a connection that was never registered why it is closed, then close it."""
        try:
            conn.sock.send(p.Refused(reason).encode(), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        except OSError:
            pass
        conn.sock.close()

    def _conn_of(self, job_id: int) -> _Conn | None:
        for conn in self.conns.values():
            if conn.job == job_id:
                return conn
        return None

    def _on_conn(self, sock, events) -> None:
        conn = self.conns.get(sock.fileno())
        if conn is None:
            return
        try:
            self._serve_conn(conn, events)
        except Exception as e:  # noqa: BLE001 (an error in one connection closes that one only)
            log.exception("handling a message from pid %d failed; closing its connection",
                          conn.peer_pid)
            if not conn.closing:
                self._send(conn, p.Refused(f"the coordinator failed on this connection's message "
                                           f"({type(e).__name__}: {e}; see its log) and closed it"))
                self._close(conn, f"the daemon failed on its message: {type(e).__name__}: {e}")

    def _serve_conn(self, conn: _Conn, events) -> None:
        sock = conn.sock
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
        if not events & selectors.EVENT_READ or conn.closing:
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn, "its socket closed (the job exited or died)")
            return
        try:
            messages = conn.reader.feed(data)
        except p.ProtocolError as e:
            log.warning("pid %d sent a bad message: %s", conn.peer_pid, e)
            self._send(conn, p.Refused(f"bad message: {e}"))
            self._close(conn, f"bad message: {e}")
            return
        conn.received += len(messages)
        for msg in messages:
            if conn.closing:
                return
            self._handle(conn, msg)

    def _handle(self, conn: _Conn, msg: p.Message) -> None:
        now = time.monotonic()
        if isinstance(msg, p.Status):
            if conn.job is None:
                conn.deadline = now + self.config.hello_timeout
            self._send(conn, p.StatusReply(self.status(asking=conn)))
        elif isinstance(msg, p.Hello):
            self._hello(conn, msg, now)
        elif isinstance(msg, p.Bye):
            self._close(conn, "it said bye")
        elif conn.job is None:
            self._send(conn, p.Refused(f"{msg.TYPE!r} before 'hello': attach first"))
            self._close(conn, None)
        elif isinstance(msg, p.Resume):
            log.info("job %d (pid %d) resumes at batch %d of epoch %d (its first epoch: %d)",
                     conn.job, conn.peer_pid, msg.batches, msg.epoch, msg.start_epoch)
            self._reply(conn, self.scheduler.resume(conn.job, msg.epoch, msg.batches,
                                                    msg.start_epoch))
        elif isinstance(msg, p.Begin):
            self._reply(conn, self.scheduler.begin(conn.job, now))
        elif isinstance(msg, p.Next):
            for reply in self.scheduler.ask(conn.job, now, msg.count):
                self._reply(conn, reply)
        elif isinstance(msg, p.Release):
            for index in range(msg.index, msg.index + msg.count):
                self.scheduler.release(conn.job, index, now)
        elif isinstance(msg, p.Pause):
            self.scheduler.pause(conn.job, now)

    def _reply(self, conn: _Conn, msg: p.Message) -> None:
        self._send(conn, msg)
        if isinstance(msg, p.Refused):
            self._close(conn, msg.reason)

    def _hello(self, conn: _Conn, msg: p.Hello, now: float) -> None:
        problem = mismatch(msg, self.dataset, self.plan, self.spec)
        if problem is None and conn.job is not None:
            problem = "this connection is already attached as a job"
        if problem is not None:
            self._send(conn, p.Refused(problem))
            self._close(conn, None)
            return
        job = self.scheduler.attach(conn.peer_pid, now)
        conn.job, conn.deadline = job.id, None
        log.info("job %d (pid %d) attached; it starts at epoch %d", job.id, conn.peer_pid,
                 job.start_epoch)
        self._send(conn, p.Welcome(job.id, os.getpid(), self._running()[0].path, self.layout.slots,
                                   self.plan.batch_size, *self.spec.wire(),
                                   self.plan.batches_per_epoch, self.plan.epochs, self.plan.seed,
                                   job.start_epoch))

    def _send(self, conn: _Conn, msg: p.Message) -> None:
        """Queue `msg`; the loop flushes every connection's replies once per turn (`_flush_all`),
        so the replies of one turn (a Next's ready batches) leave in one write."""
        if conn.closing and not isinstance(msg, (p.Refused, p.Detached, p.ShuttingDown)):
            return
        conn.out += msg.encode()
        self._unflushed[id(conn)] = conn  # a closing one: _close writes what is left

    def _flush_all(self) -> None:
        unflushed, self._unflushed = self._unflushed, {}
        for conn in unflushed.values():
            if not conn.closing:
                self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            while conn.out:
                sent = conn.sock.send(conn.out, socket.MSG_NOSIGNAL)
                del conn.out[:sent]
                conn.writes += 1
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            conn.out.clear()
        fd = conn.sock.fileno()
        if fd < 0 or fd not in self.conns:
            return
        if len(conn.out) > _MAX_OUTBUF:
            self._close(conn, "it does not read its replies")
            return
        if bool(conn.out) != conn.writing:  # wait for room to write only while something is left
            conn.writing = bool(conn.out)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self.sel.modify(conn.sock, events, self._on_conn)

    def _close(self, conn: _Conn, reason: str | None) -> None:
        fd = conn.sock.fileno()
        if fd in self.conns:
            del self.conns[fd]
            self.sel.unregister(conn.sock)
        conn.closing = True
        if conn.job is not None:
            owed = self.scheduler.owed
            self.scheduler.detach(conn.job, time.monotonic())
            self.detached += 1
            if self.scheduler.owed > owed and self.plan.epochs is not None:
                log.info("job %d (pid %d) left with epochs to go: the daemon waits up to --linger "
                         "%g s for a job to resume before it stops", conn.job, conn.peer_pid,
                         self.config.linger)
            log.info("job %d (pid %d) detached: %s", conn.job, conn.peer_pid, reason or "refused")
            conn.job = None
        try:
            conn.sock.send(conn.out, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        except OSError:
            pass
        conn.sock.close()

    # -- status --
    def status(self, asking: _Conn | None = None) -> dict:
        """The daemon's state (`coordl status`). `asking`, the connection the request came on, is
        not counted among the connections unless it is an attached job: `coordl status` (and
        `Client.status`, over a connection of its own) must not count itself."""
        now = time.monotonic()
        others = [c for c in self.conns.values() if c is not asking or c.job is not None]
        window = [s for s in self._rate if now - s[0] <= 10.0] or [self._rate[-1]]
        (t0, n0), (t1, n1) = window[0], (now, self.produced_images)
        counters = {k: int(v) for k, v in self.pool.counters.items()} if self.pool else {}
        return {
            "pid": os.getpid(), "socket": self.socket_path, "ring": self.ring.path if self.ring else None,
            "data": self.served[0], "fingerprint": self.dataset.fingerprint, "items": len(self.dataset),
            "transform": self.served[1], "size": self.spec.size,  # an image ring's N, else 0
            "sample_shape": list(self.spec.delivered), "sample_dtype": self.spec.dtype,  # a job's samples
            "batch_size": self.plan.batch_size, "batches_per_epoch": self.plan.batches_per_epoch,
            "epochs": self.plan.epochs,  # each job's (None: no limit)
            "seed": self.plan.seed, "shuffle": self.plan.shuffle, "drop_last": self.plan.drop_last,
            "on_error": self.dataset.on_error, "slots": self.layout.slots,
            "ring_mib": round(self.layout.total_bytes / 2**20, 1),
            "workers": self.pool.pids if self.pool else [], "worker_deaths": self.pool.deaths if self.pool else 0,
            "backend": self.config.backend,
            "dali_device": self.config.dali_device if self.config.backend == "dali" else None,
            "occupancy": self.slots.counts(), "next_batch": self.scheduler.next_batch,
            "started": self.scheduler.started, "min_jobs": self.config.min_jobs,
            "gathering": self.scheduler.gathering, "join_window": self.config.join_window,
            "connections": len(others),  # open, the asker's own excluded; jobs are among them
            "jobs_attached": sum(c.job is not None for c in others),
            "max_connections": _MAX_CONNECTIONS,
            "hello_timeout": self.config.hello_timeout,
            "produced_batches": self.produced_batches, "produced_images": self.produced_images,
            "decodes": counters.get("decodes", 0), "counters": counters,
            "images_per_s": round((n1 - n0) / (t1 - t0), 1) if t1 > t0 else 0.0,
            "uptime_s": round(now - self.started_at, 1), "detached": self.detached,
            "straggler_timeout": self.config.straggler_timeout,
            "linger": self.config.linger,  # s it waits for a job that left with epochs to go
            "owed": self.scheduler.owed,   # jobs that left with epochs to go, not resumed since
            "cache": self.cache.stats() if self.cache is not None else None,
            "jobs": [self._job_status(j, now) for j in self.scheduler.jobs.values()],
        }

    def _job_status(self, job: Job, now: float) -> dict:
        """A job's line of `status`: the scheduler's, and the messages it sent and the writes it
        was answered with (counted per connection: a job of its own batch size sends about two
        messages per batch and gets about one write, not one per chunk of the daemon's)."""
        conn = self._conn_of(job.id)
        return {**self.scheduler.job_status(job, now), "messages": conn.received if conn else 0,
                "writes": conn.writes if conn else 0}



def served_dataset(config: ServeConfig) -> Any:
    """The dataset a daemon of `config` serves, as a job builds it to attach (same samples): the
    ImageFolder of --data, or the --dataset class built with --dataset-args, --seed, --on-error."""
    from coordl.datasets.base import from_import_path
    from coordl.datasets.imagefolder import ImageFolder

    if config.dataset:
        return from_import_path(config.dataset, config.dataset_args, config.seed, config.on_error)
    return ImageFolder(config.data, transform=config.transform, size=config.image_size, seed=config.seed,
                       on_error=config.on_error, storage_options=config.storage_options)


def _refuse_live_socket(path: str) -> None:
    """Raise if a daemon already accepts on `path`; remove a stale socket file."""
    try:
        state = shm.socket_state(path, timeout=2.0)
    except OSError as e:
        raise CoordinatorError(f"cannot check socket {path!r}: {e.strerror or e}") from None
    if state == shm.ABSENT:
        return
    if state == shm.NOT_SOCKET:
        raise CoordinatorError(f"--socket {path!r} exists and is not a socket: pass another path")
    if state == shm.STALE:
        segments.unlink(path)  # its daemon is gone
        return
    raise CoordinatorError(f"a coordinator already listens on {path!r}: stop it (coordl status "
                           f"--socket {path} shows its pid) or pass another --socket")

