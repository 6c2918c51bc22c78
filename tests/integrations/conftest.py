"""Real Lightning and Accelerate (test-only dependencies, `pip install -e '.[integrations]'`)."""

from __future__ import annotations

import os

import coordl_tests_jobs as jobs
import pytest

from coordl.cli.make_dataset import make_dataset

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")


@pytest.fixture(scope="session")
def ids_root(tmp_path_factory) -> str:
    """30 JPEGs, one per class folder: a sample's label is its dataset index."""
    root = str(tmp_path_factory.mktemp("ids"))
    make_dataset(root, images=30, classes=30, size=(64, 48), quality=85, seed=4, workers=1, progress=False)
    return root


def run_job(args: list[str], nproc: int = 1, timeout: float = 150, env: dict | None = None) -> str:
    """A job script of tests/integrations/jobs, as one process or under torchrun; its stdout.
    Bounded as coordl_tests_jobs.run says: a hung job fails with its processes' stacks, and
    nothing it started outlives the test."""
    return jobs.run(jobs.command(os.path.join(JOBS, args[0]), args[1:], nproc), env, timeout)


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
