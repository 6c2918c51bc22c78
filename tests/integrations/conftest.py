"""Real Lightning and Accelerate (test-only dependencies, `pip install coordl[integrations]`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from coordl.cli.make_dataset import make_dataset

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


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


def run_job(args: list[str], nproc: int = 1, timeout: float = 300, env: dict | None = None) -> str:
    """A job script of tests/integrations/jobs, as one process or under torchrun; its stdout."""
    script = os.path.join(JOBS, args[0])
    if nproc == 1:
        cmd = [sys.executable, script, *args[1:]]
    else:
        cmd = [TORCHRUN, f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", script, *args[1:]]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture
def job():
    """`job(["script.py", args...], nproc=1)`: run a job script and return its stdout."""
    return run_job
