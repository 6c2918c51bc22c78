"""Real coordinator daemons (`coordl serve` processes) and real job processes for the tests."""

from __future__ import annotations

import gc
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import coordl_tests_forked as forked
import psutil
import pytest

from coordl.coordinator import client, segments

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "job_main.py")


class Served:
    """One `coordl serve` process started by the `serve` fixture."""

    def __init__(self, proc, socket: str, log: str) -> None:
        self.proc, self.socket, self.log = proc, socket, log
        self.address = "unix://" + socket
        st = self.status_at_start = self.status()
        self.pid, self.ring, self.workers = st["pid"], st["ring"], st["workers"]
        self.prefix = segments.daemon_prefix(self.pid)

    def status(self) -> dict:
        return client.status(self.socket)

    def segments_left(self) -> list[str]:
        return [n for n in os.listdir(segments.SHM_DIR) if n.startswith(self.prefix)]

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        with open(self.log) as f:
            return f.read()


@pytest.fixture
def sockdir():
    """A short private folder for sockets (AF_UNIX paths are limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix="cdl-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(sockdir: str, root: str, batch_size: int = 4, size: int = 32, name: str = "s.sock",
           program: list[str] | None = None, new_session: bool = False, **options) -> Served:
    """Start one `coordl serve` with its socket and log in `sockdir`; wait until it listens."""
    sock = os.path.join(sockdir, name)
    log = os.path.join(sockdir, name + ".err")
    argv = [*(program or [COORDL]), "serve", "--data", root, "--batch-size", str(batch_size), "--size", str(size),
            "--socket", sock, "--workers", str(options.pop("workers", 2))]
    options.setdefault("join_window", 0)
    for key, value in options.items():
        if value is None:
            continue
        flag = f"--{key.replace('_', '-')}"
        argv += [flag] if value is True else [flag, str(value)]
    with open(log, "w") as err:
        # `coordl serve` forked from this process (tests/forked.py: no torch import), but for the DALI
        # backend: DALI's threads and state in this process (a test's own DALI pipeline) are not fork-safe
        if program is None and options.get("backend") != "dali":
            proc = forked.coordl(argv[1:], stdout=subprocess.PIPE, stderr=err, start_new_session=new_session)
        else:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                    start_new_session=new_session)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if "listening" not in line:
        proc.kill()
        proc.wait()
        with open(log) as f:
            pytest.fail(f"coordl serve did not start: {line!r}\n{f.read()}")
    return Served(proc, sock, log)


def _stop(served: Served) -> None:
    if served.proc.poll() is None:
        served.stop()
    served.proc.stdout.close()


@pytest.fixture
def serve(sockdir):
    """serve(root, batch_size=4, size=32, **options) -> Served; every daemon is stopped after the test.

    Options are `coordl serve` flags (min_jobs=2 -> --min-jobs 2, True -> a bare flag). The join
    window is 0 unless a test asks for one (join_window=None: the daemon's default). `program`
    replaces the `coordl` command (argv before "serve"); `new_session=True` starts it in a
    process group of its own (a test may then signal the whole group, as systemd or a shell's
    `kill -- -PGID` does). A test that only reads batches or status from a daemon with the
    defaults over tiny_root uses `shared_serve` instead."""
    started: list[Served] = []

    def start(root: str, **kw) -> Served:
        served = _start(sockdir, root, **kw)
        started.append(served)
        return served

    yield start
    for served in started:
        _stop(served)


@pytest.fixture(scope="module")
def _module_daemon(tiny_root):
    """The daemon behind `shared_serve`: one per test module, started on first use; at the end
    of the module it must stop cleanly (exit 0, no segment left, no worker left)."""
    path = tempfile.mkdtemp(prefix="cdl-", dir="/tmp")
    served = _start(path, tiny_root)
    try:
        yield served
        assert served.stop() == 0, f"the shared daemon exited {served.proc.returncode}:\n{served.log_text()}"
        assert served.segments_left() == []
        assert [p for p in served.workers if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []
    finally:
        _stop(served)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shared_serve(_module_daemon):
    """One `coordl serve` over tiny_root with the `serve` defaults (batch 4, size 32, 2 workers,
    join window 0, no --epochs), shared by the read-only tests of a module: tests that attach
    jobs, read batches or status, or are refused, and never stop, signal or reconfigure it (those
    use `serve`). Each test starts with no job attached (the ones of an earlier test have gone)."""
    served = _module_daemon
    deadline = time.monotonic() + 10.0
    while True:
        assert served.proc.poll() is None, f"the shared daemon exited:\n{served.log_text()}"
        if not served.status()["jobs"]:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the shared daemon still has jobs of an earlier test: {served.status()['jobs']}")
        gc.collect()  # a loader an earlier test dropped closes its connection when collected
        time.sleep(0.05)
    return served


class Job:
    """One job process (job_main.py) attached to a daemon."""

    def __init__(self, root: str, served: Served, out: str, **args) -> None:
        self.out, self._pending = out, b""
        spec = {"root": root, "socket": served.socket, "batch_size": 4, "size": 32, "epochs": 2,
                "sleep": 0.0, "out": out, **args}
        self.proc = forked.script(JOB, [json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Read the job's output until a line equal to `text` (or fail)."""
        # os.read on the descriptor, lines split here: a buffered readline() would keep lines
        # that already arrived where select() cannot see them
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                if line.decode().strip() == text:
                    return
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self._pending += chunk
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            with open(self.out) as f:
                said = f.read()
        except FileNotFoundError:
            said = "(no result)"
        pytest.fail(f"job never printed {text!r}; stderr: {self.proc.stderr.read()}; result: {said[:2000]}")

    def result(self, timeout: float = 120.0) -> dict:
        self.proc.wait(timeout)
        self.proc.stdout.close()
        err = self.proc.stderr.read()
        self.proc.stderr.close()
        try:
            with open(self.out) as f:
                return {**json.load(f), "returncode": self.proc.returncode}
        except FileNotFoundError:
            pytest.fail(f"job wrote no result (exit {self.proc.returncode}): {err}")


@pytest.fixture
def jobs(tmp_path):
    """jobs(root, served, **args) -> Job; each is reaped (killed if needed) after the test."""
    started: list[Job] = []

    def start(root: str, served: Served, **args) -> Job:
        job = Job(root, served, str(tmp_path / f"job{len(started)}.json"), **args)
        started.append(job)
        return job

    yield start
    for job in started:
        if job.proc.poll() is None:
            job.proc.kill()
        job.proc.wait()
        for stream in (job.proc.stdout, job.proc.stderr):
            if not stream.closed:
                stream.close()


def _drain(loader) -> tuple[int, list[str]]:
    """One epoch of `loader`, going on past batches that fail: (images received, error messages)."""
    import coordl

    got, errors = 0, []
    it = iter(loader)
    while True:
        try:
            got += next(it)[0].shape[0]
        except StopIteration:
            return got, errors
        except coordl.SampleError as e:
            errors.append(str(e))


@pytest.fixture
def drain():
    """drain(loader) -> (images, errors): one epoch that goes on past failed batches."""
    return _drain
