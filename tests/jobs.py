"""Run a training job (a script, or torchrun and its ranks) as the user would, bounded: the job
runs in a session of its own; one that outlives its time (below pytest-timeout's 300 s, so that
this, not pytest-timeout, reports it) fails the test with the job's output and the Python stacks
of every process in its session (py-spy, a dev dependency), which are then killed; one that ends
with processes of its session still alive a minute later fails too. Nothing outlives the test.

Importable as `coordl_tests_jobs` (registered by tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psutil
import pytest

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
PY_SPY = os.path.join(os.path.dirname(sys.executable), "py-spy")


def command(script: str, args: list[str], nproc: int = 1) -> list[str]:
    """`script args` in this interpreter, or under torchrun with `nproc` ranks. `--standalone`:
    torchrun's own store listens on a port the kernel picks and holds it for the ranks, so no
    other process (another test's job or server) can take that port between a choice and its
    use, as it could with a port found free beforehand."""
    if nproc == 1:
        return [sys.executable, script, *args]
    return [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", script, *args]


def _session(sid: int) -> list[psutil.Process]:
    """Every process of the job's session (its own, other ranks, their workers), orphans too."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def _stacks(procs: list[psutil.Process]) -> str:
    """Each process's Python stacks, or its command line where py-spy fails."""
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


def run(cmd: list[str], env: dict | None = None, timeout: float = 150) -> str:
    """Run `cmd` to its end; its stdout. Its environment is this one's with one thread per op
    (2 cores here), warnings off and `env` over them. Fails the test (with its output) when it
    exits non-zero, outlives `timeout` or leaves processes behind."""
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
