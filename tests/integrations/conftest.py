"""Real Lightning and Accelerate (test-only dependencies, `pip install coordl[integrations]`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import psutil
import pytest

from coordl.cli.make_dataset import make_dataset

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
PY_SPY = os.path.join(os.path.dirname(sys.executable), "py-spy")  # (dev extra: stacks of a job that hangs)


@pytest.fixture(scope="session")
def ids_root(tmp_path_factory) -> str:
    """30 JPEGs, one per class folder: a sample's label is its dataset index."""
    root = str(tmp_path_factory.mktemp("ids"))
    make_dataset(root, images=30, classes=30, size=(64, 48), quality=85, seed=4, workers=1, progress=False)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session(sid: int) -> list[psutil.Process]:
    """Every process of the job's session (its own, Lightning's other ranks, their workers), orphans too."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def _stacks(procs: list[psutil.Process]) -> str:
    """Each process's Python stacks (py-spy, a dev dependency), or its command line where py-spy fails."""
    out = []
    for p in procs:
        try:
            dump = subprocess.run([PY_SPY, "dump", "--pid", str(p.pid)], capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            dump = f"(py-spy: {e})"
        try:
            out.append(f"--- pid {p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:200]}\n{dump}")
        except psutil.Error:
            out.append(f"--- pid {p.pid} (gone)")
    return "\n".join(out)


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


def run_job(args: list[str], nproc: int = 1, timeout: float = 150, env: dict | None = None) -> str:
    """A job script of tests/integrations/jobs, as one process or under torchrun; its stdout.

    The job runs in a session of its own. One that outlives `timeout` (below pytest's own 300 s,
    so that this, not pytest-timeout, reports it) fails the test with the job's output and the
    stacks of every process in its session, which are then killed (none outlives the test)."""
    script = os.path.join(JOBS, args[0])
    if nproc == 1:
        cmd = [sys.executable, script, *args[1:]]
    else:
        cmd = [TORCHRUN, f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", script, *args[1:]]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs = _session(proc.pid)
        stacks = _stacks(procs)
        _kill(procs)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s\n{stdout[-2000:]}\n{stderr[-4000:]}\n"
                    f"stacks of its processes:\n{stacks}")
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    _gone, leftover = psutil.wait_procs(_session(proc.pid), timeout=60)  # a rank or worker still exiting
    _kill(leftover)
    assert not leftover, f"{' '.join(cmd)} left processes behind a minute after it ended: {leftover}"
    return stdout


@pytest.fixture
def job():
    """`job(["script.py", args...], nproc=1)`: run a job script and return its stdout."""
    return run_job


# The 2-epoch runs with a checkpoint every 3 steps that test_lightning.py and test_lightning_elastic.py
# both start from, by number of devices: (use_distributed_sampler, workers, launched by torchrun).
#   1: Lightning's default sampler setting (it leaves one process's sampler alone), no workers;
#   2: DDP with coordl's own ranks (use_distributed_sampler=False), 2 persistent workers a rank,
#      both ranks started by torchrun (Lightning's own launcher is test_lightning's other DDP run).
SAVED = {1: ("1", "0", 1), 2: ("0", "2", 2)}


@pytest.fixture(scope="session")
def saved_run(ids_root, tmp_path_factory):
    """saved_run(devices) -> the folder of that run (steps-rank<r>.json, ckpt/step=<n>.ckpt), made
    on first use and shared by the tests of this test process."""
    runs: dict[int, object] = {}

    def get(devices: int):
        if devices not in runs:
            full = tmp_path_factory.mktemp(f"saved{devices}")
            use_ds, workers, nproc = SAVED[devices]
            run_job(["lightning_job.py", ids_root, str(full), str(devices), use_ds, workers, "2", "3"], nproc=nproc)
            runs[devices] = full
        return runs[devices]

    return get
