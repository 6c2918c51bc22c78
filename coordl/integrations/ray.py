"""Ray Tune: the trials of a search on one node share that node's coordinator daemon.

    from ray import tune
    from coordl.integrations.ray import shared_prep

    def train(config, prep):
        loader = prep.loader(batch_size=config["batch_size"])  # this node's daemon, its own batch size
        for epoch in range(3):
            for images, labels in loader:
                ...
            tune.report({"loss": ...})

    with shared_prep("/data/train", batch_size=32, size=224) as prep:  # one daemon per node
        trainable = tune.with_parameters(train, prep=prep)
        tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}),
                           param_space={"batch_size": tune.grid_search([32, 64])})
        results = tuner.fit()
        print(prep.status())                                        # per node: jobs, decodes

Every trial is a job of `coordl serve` (coordl/coordinator/): each item is decoded and
augmented once per epoch on a node for all the trials there, whatever their batch sizes; each
trial gets the batches a local `coordl.DataLoader` with its batch size would give. docs/ray-tune.md
is the guide. Ray is imported when first used: `pip install -e '.[ray]'`.

NOTE (lifecycle of every process and file):
- actors: `shared_prep` (in the driver, after `ray.init`, which it calls if nobody has) starts one
  actor per alive node, `NodeDaemon`, with no CPU, pinned there (NodeAffinitySchedulingStrategy,
  not soft). It owns the node's daemon; only the driver holds its handle.
- daemon: a child of its actor in a session of its own (a terminal's Ctrl+C is the driver's to
  handle), `coordl serve` run by `_serve_main` with PR_SET_PDEATHSIG SIGTERM. Its socket and log
  (`serve.sock`, `serve.log`) live in a folder of the actor's, mkdtemp (mode 0700) in the node's
  temp dir (in /tmp where that path is too long for a socket); its ring, as any daemon's, in
  COORDL_SHM_DIR (/dev/shm) under its own prefix.
- the end: leaving the `with` block (normally, by an exception, by KeyboardInterrupt), or
  `prep.close()`, asks each actor to stop its daemon (SIGTERM: it unlinks its ring and removes
  its socket; SIGKILL after `stop_timeout` seconds, then its segments are removed by name),
  remove its folder, and then kills the actors.
- an actor that dies first (ray.kill, a crash): Ray kills a dead worker's children (SIGKILL),
  so its daemon dies without unlinking its ring (where Ray leaves them alone, the death signal
  stops it the clean way). `close()` then runs a task on that node, `_clear_node`, that removes
  what the daemon left: its segments (names carry its pid and start time) and its folder.
  Where the driver itself dies (SIGKILL), Ray kills the actors and so the daemons, and nobody
  is left to clear: `coordl cleanup` on the node removes the rings (as after any killed daemon),
  and the `coordl-ray-*` folders stay in the temp dir.
- trials: `prep.loader(...)` is a `coordl.DataLoader` attached to the daemon of the node the trial
  runs on. A trial that Tune stops early (a scheduler such as ASHA, a stopper) gets SystemExit out
  of `tune.report` (Ray Tune's own way to end a trial's function): the iterator it was in is
  dropped, which gives up its chunk at once, and its actor process ends, which closes its socket:
  the daemon detaches it as it detaches a dead job, and the other trials go on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any

from coordl.coordinator.config import ServeConfig, socket_folder
from coordl.errors import ConfigError, CoordinatorError, CoordlError

INSTALL_HINT = "pip install -e '.[ray]' (a user's install: pip install 'coordl[ray]')"
# what shared_prep chooses itself: the socket (one per node), the process (an actor's child)
_NOT_OPTIONS = ("socket",)
_READY = "coordl-ray: listening on "


def _ray() -> Any:
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"coordl.integrations.ray needs Ray ({e}): {INSTALL_HINT}") from None
    return ray


def serve_options(data: str | None = None, batch_size: int = 0, **options: Any) -> dict[str, Any]:
    """The `coordl serve` settings of a daemon per node (coordl/coordinator/config.py ServeConfig's
    fields, as `coordl serve` flags name them: `min_jobs=4` is --min-jobs 4), checked here, in the
    driver, so that a bad value fails before a node starts anything. A local `data` folder becomes
    absolute (Tune runs each trial in a folder of its own)."""
    names = {f.name for f in dataclasses.fields(ServeConfig)} - set(_NOT_OPTIONS)
    unknown = sorted(set(options) - names)
    if unknown or set(options) & set(_NOT_OPTIONS):
        bad = ", ".join(f"{k}=" for k in unknown or sorted(set(options) & set(_NOT_OPTIONS)))
        known = ", ".join(sorted(names - {"data", "batch_size"}))
        raise ConfigError(f"shared_prep({bad}): not a daemon setting here (the socket is chosen per "
                          f"node); use among {known}")
    if data and "://" not in data:
        data = os.path.abspath(os.path.expanduser(data))
    if isinstance(options.get("cache_bytes"), str):
        from coordl.cache.sizes import parse_size

        options["cache_bytes"] = parse_size(options["cache_bytes"], "cache_bytes")
    fields = {"data": data or "", "batch_size": batch_size, **options}
    ServeConfig(**fields)  # every check of `coordl serve`; ConfigError naming the flag
    return fields


class NodeDaemon:
    """One node's `coordl serve`, started and stopped by the Ray actor that holds this object (see
    the NOTE above). Ray makes it an actor class in `shared_prep`; it works as a plain object too."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.folder = socket_folder("coordl-ray-")  # mode 0700: the socket's private folder (a long
        # $TMPDIR: in /tmp, for the socket's path to fit)
        self.config = ServeConfig(**options, socket=os.path.join(self.folder, "serve.sock"))
        self.log = os.path.join(self.folder, "serve.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> dict[str, Any]:
        """Start the daemon; once it listens, where it is: {"socket", "pid", "start" (its start time:
        the pid's identity), "folder", "shm_dir"}. CoordinatorError with its error if it does not."""
        import select

        from coordl.cache import shm

        fields = dataclasses.asdict(self.config)
        code = "from coordl.integrations.ray import _serve_main; _serve_main()"
        with open(self.log, "wb") as log:  # a session of its own: a terminal's Ctrl+C is the driver's
            self.proc = subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), json.dumps(fields)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode(errors="replace") if ready else ""
        if not line.startswith(_READY):
            try:  # its output ended: it is exiting
                exited = self.proc.wait(10) if ready else None
            except subprocess.TimeoutExpired:
                exited = None
            said = self._log_tail(5)
            self.stop(5.0)
            how = f"exited ({exited})" if exited is not None else f"did not listen within {timeout:g} s"
            raise CoordinatorError(f"coordl serve for shared_prep on this node {how}: {said or 'no output'}")
        return {"socket": self.config.socket, "pid": self.proc.pid, "start": shm.proc_start(self.proc.pid),
                "folder": self.folder, "shm_dir": shm.SHM_DIR}

    def status(self) -> dict[str, Any]:
        """`coordl status --json` of this node's daemon."""
        from coordl.coordinator.channel import status

        if self.proc is not None and self.proc.poll() is not None:
            raise CoordinatorError(f"coordl serve on this node exited ({self.proc.returncode}; with epochs="
                                   f"{self.config.epochs}, it exits once its jobs have had them): "
                                   f"{self._log_tail(3)}")
        return status(self.config.socket)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; SIGKILL after `timeout` s and remove what the daemon left; then remove
        the folder. The daemon's exit code (None: it had not started)."""
        proc, code = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            _remove_left(proc.pid, self.folder)  # what a daemon killed (not stopped) left; else nothing
        shutil.rmtree(self.folder, ignore_errors=True)
        return code

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:]).strip()
        except OSError:
            return ""


def _remove_left(pid: int, folder: str, shm_dir: str | None = None) -> None:
    """What the daemon `pid` (gone: killed, not stopped) left: its segments (the names carry its pid
    and start time, segments.py; none of a living daemon is touched) and its folder."""
    from coordl.cache import shm
    from coordl.coordinator import segments

    directory = shm.SHM_DIR if shm_dir is None else shm_dir
    for name in shm.list_names(directory, f"{segments.PREFIX}{pid}-"):
        if not segments.owner_alive(name):
            segments.unlink(os.path.join(directory, name))
    shutil.rmtree(folder, ignore_errors=True)


def _clear_node(where: dict[str, Any], timeout: float) -> None:
    """A Ray task on a node whose actor died before it stopped the daemon (ray.kill, a crash: Ray
    kills a dead worker's children with SIGKILL, before the daemon's death signal can stop it the
    clean way): stop the daemon if it still runs, then remove what it left."""
    import time

    from coordl.cache import shm

    pid, start = where["pid"], where["start"]
    if shm.alive(pid, start):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while shm.alive(pid, start) and time.monotonic() < deadline:
            time.sleep(0.05)
        if shm.alive(pid, start):
            os.kill(pid, signal.SIGKILL)
    _remove_left(pid, where["folder"], where["shm_dir"])


def _serve_main() -> None:
    """The daemon process a NodeDaemon starts (argv: the actor's pid, the ServeConfig as JSON):
    dies with its actor (SIGTERM, handled as `coordl serve` handles it), then serves."""
    import ctypes
    import logging

    from coordl.coordinator.daemon import Daemon

    parent, fields = int(sys.argv[1]), json.loads(sys.argv[2])
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the actor died before prctl took effect
        sys.exit(1)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s coordl serve[%(process)d] (ray): %(message)s")

    def ready(daemon: Daemon) -> None:
        print(f"{_READY}{daemon.socket_path}", flush=True)

    try:
        config = ServeConfig(**fields)
        if config.dali_device == "gpu":
            from coordl.coordinator.config import check_cuda_devices

            check_cuda_devices()
        daemon = Daemon(config)  # scans the dataset: its errors, in words, before it listens
    except CoordlError as e:
        print(f"coordl serve: error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    daemon.run(ready=ready)


class SharedPrep:
    """One `coordl serve` daemon per node of a Ray cluster, for one search. Made by `shared_prep`;
    pass it to the trainable (`tune.with_parameters(train, prep=prep)`, or a closure): it pickles
    into the trials as its settings and each node's socket, and there `prep.loader(...)` attaches
    to the trial's node's daemon. `status()` and `close()` are the driver's."""

    def __init__(self, options: dict[str, Any], daemons: list[_Daemon]) -> None:
        self.config = ServeConfig(**options)   # the settings every node's daemon serves (its socket aside)
        self.addresses = {d.node: d.where["socket"] for d in daemons}  # node id -> its daemon's socket
        self._daemons: list[_Daemon] | None = daemons  # the driver's (None in a trial)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_daemons": None}

    def address(self) -> str:
        """``unix://...`` of this node's daemon (the node this trial, or the driver, runs on)."""
        node = _ray().get_runtime_context().get_node_id()
        try:
            return "unix://" + self.addresses[node]
        except KeyError:
            raise CoordinatorError(
                f"node {node} has no coordl daemon of this search: shared_prep started one on the "
                f"nodes alive then ({', '.join(n[:12] for n in self.addresses)}); start shared_prep "
                "once the cluster has its nodes (an autoscaled node added later has none)") from None

    def dataset(self) -> Any:
        """The dataset the daemons serve, as a job builds it to attach: the ImageFolder of `data`
        (its transform, size, seed, on_error), or the `dataset` class with `dataset_args`."""
        from coordl.coordinator.daemon import served_dataset

        return served_dataset(self.config)

    def loader(self, batch_size: int, dataset: Any = None, **kwargs: Any) -> Any:
        """A `coordl.DataLoader` over the daemon of this node: `batch_size` the trial's own (any,
        with drop_last as it likes, unless the daemon drops the last chunk), `dataset` by default
        `self.dataset()`, shuffle as the daemon, other arguments as coordl.DataLoader takes them."""
        import coordl

        kwargs.setdefault("shuffle", self.config.shuffle)
        return coordl.DataLoader(self.dataset() if dataset is None else dataset, batch_size=batch_size,
                                 coordinator=self.address(), **kwargs)

    def status(self) -> dict[str, dict[str, Any]]:
        """node id -> `coordl status --json` of its daemon (jobs attached, `decodes`, ...)."""
        daemons = self._driver("status()")
        return {d.node: status for d, status in zip(daemons, _ray().get([d.actor.status.remote() for d in daemons]))}

    def close(self, stop_timeout: float = 30.0) -> None:
        """Stop every node's daemon and its actor (see the NOTE); a second call does nothing."""
        daemons, self._daemons = self._daemons, []
        if daemons:
            _stop(daemons, stop_timeout)

    def __enter__(self) -> SharedPrep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _driver(self, what: str) -> list[_Daemon]:
        if self._daemons is None:
            raise CoordinatorError(f"SharedPrep.{what} is the driver's (the process that called "
                                   "shared_prep); in a trial use loader.stats()")
        if not self._daemons:
            raise CoordinatorError(f"SharedPrep.{what}: this search's daemons have been stopped")
        return self._daemons


def shared_prep(data: str | None = None, *, batch_size: int, start_timeout: float = 120.0,
                **options: Any) -> SharedPrep:
    """Start one `coordl serve` daemon on every alive node of the Ray cluster for one search.

    `data`, `batch_size` (the chunk size C the daemon prepares: every trial may ask its own batch
    size) and `options` are `coordl serve`'s (ServeConfig's fields: size, transform, seed, workers,
    cache_bytes ("8GiB" too), slots, min_jobs, join_window, straggler_timeout, epochs, dataset,
    dataset_args, ...), the same on every node. Use it as a context manager around `tuner.fit()`:
    the daemons stop at the end of the block, whatever ends it. Leave `epochs` unset unless every
    trial runs at once: a daemon with `epochs` exits once its jobs have had them, before trials
    that Tune has queued begin. `min_jobs` (the trials that run at once on a node) makes the
    first batch wait for them all, so they share every epoch from the first."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    fields = serve_options(data, batch_size, **options)
    if not ray.is_initialized():
        ray.init()
    actor_class = ray.remote(num_cpus=0, max_restarts=0)(NodeDaemon)
    daemons: list[_Daemon] = []
    try:
        for node in [n["NodeID"] for n in ray.nodes() if n.get("Alive")]:
            where = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            daemons.append(_Daemon(node, actor_class.options(scheduling_strategy=where).remote(fields)))
        starts = [d.actor.start.remote(start_timeout) for d in daemons]
        for d, ref in zip(daemons, starts):
            d.where = ray.get(ref)
    except BaseException as e:
        _stop(daemons, 5.0)
        cause = getattr(e, "cause", None)  # a RayTaskError: raise coordl's own, with its message
        if isinstance(cause, CoordlError):
            raise cause from None
        raise
    return SharedPrep(fields, daemons)


@dataclasses.dataclass
class _Daemon:
    """One node's daemon, as the driver knows it."""

    node: str                        # Ray node id
    actor: Any                       # its NodeDaemon actor
    where: dict[str, Any] = dataclasses.field(default_factory=dict)  # NodeDaemon.start's answer


def _stop(daemons: list[_Daemon], timeout: float) -> None:
    """Ask every actor to stop its daemon and kill the actors; on the nodes where an actor had died
    before (its daemon killed, not stopped), remove what the daemon left (`_clear_node`). Nothing to
    do once Ray is shut down: the actors died with it (see the NOTE)."""
    ray = _ray()
    if not ray.is_initialized():
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    failed = []
    try:
        stops = [d.actor.stop.remote(timeout) for d in daemons]
        for d, ref in zip(daemons, stops):
            try:
                ray.get(ref, timeout=timeout + 30)
            except ray.exceptions.RayError:  # the actor died (RayActorError), its stop failed or hung
                failed.append(d)
    finally:
        for d in daemons:
            ray.kill(d.actor)
    clear = ray.remote(num_cpus=0, max_retries=0)(_clear_node)
    refs = [clear.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=d.node, soft=False))
            .remote(d.where, timeout) for d in failed if d.where]
    ray.wait(refs, num_returns=len(refs), timeout=timeout + 30)
