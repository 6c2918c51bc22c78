"""bench/sharing.py (the sharing curve of issue 37) runs as a user runs it, on a handful of images.

A real `coordl serve` and real job processes; the checks count (images, batches, decodes and
storage bytes per epoch, which runs and ratios the JSON holds), never speeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coordl.cli.make_dataset import make_dataset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGES, EPOCHS, SIZES = 24, 2, (8, 16)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("bench-data") / "sharing")
    make_dataset(path, images=IMAGES, classes=3, size=(64, 48), quality=85, seed=3, workers=1, progress=False)
    return path


def test_sharing_curve_counts(root, tmp_path):
    out = str(tmp_path / "sharing")
    argv = [sys.executable, os.path.join(REPO, "bench", "sharing.py"), "--data", root, "--ns", "1,2",
            "--batch-sizes", ",".join(map(str, SIZES)), "--chunk", "4", "--size", "32", "--compute-ms", "0",
            "--epochs", str(EPOCHS), "--workers", "1", "--slots", "8", "--repeats", "2", "--out", out]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out + ".json") as f:
        res = json.load(f)
    with open(out + ".md") as f:
        md = f.read()
    assert sorted(res["alone"]) == sorted(str(b) for b in SIZES)
    assert [r["n"] for r in res["runs"]] == [1, 2]
    assert [r["batch_sizes"] for r in res["runs"]] == [[8], [8, 16]]
    assert res["runs"][0]["cpu_ratio"] == 1.0  # N = 1 is its own baseline, in every round
    assert res["runs"][0]["cpu_ratios"] == [1.0, 1.0] and len(res["runs"][1]["cpu_ratios"]) == 2
    assert res["runs"][1]["cpu_ratio_min"] <= res["runs"][1]["cpu_ratio"] <= res["runs"][1]["cpu_ratio_max"]
    assert res["runs"][0]["steady_cpu_ratio"] == 1.0 and res["runs"][1]["steady_cpu_ratio"] > 0
    # storage bytes per epoch: every JPEG read once, whatever the number of jobs
    dataset_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    for run in [*res["alone"].values(), *res["runs"]]:
        assert run["decodes_per_epoch"] == IMAGES  # each item decoded once per epoch for all the jobs
        assert run["storage_bytes_per_epoch"] == dataset_bytes
        assert run["cpu_s_per_epoch"] > 0 and run["daemon_cpu_s_per_epoch"] > 0
        for job in run["jobs"]:
            assert job["images"] == EPOCHS * IMAGES
            assert job["batches"] == EPOCHS * -(-IMAGES // job["batch_size"])
            assert len(job["epoch_cpu_s"]) == EPOCHS and abs(sum(job["epoch_cpu_s"]) - job["cpu_s"]) < 1e-6
    assert res["runs"][1]["storage_ratio"] == 1.0
    assert all("vs_alone" in job for run in res["runs"] for job in run["jobs"])
    assert sum(line.startswith(("| 1 | 8 |", "| 2 | 8,16 |")) for line in md.splitlines()) == 2
