"""bench/cluster.py at a tiny size: 3 network namespaces with shaped links, cache nodes and ranks.

Needs root, `ip netns`, tc (htb, tbf), redis-server and the cgroup v1 blkio controller (skipped,
saying which is missing, otherwise). Counts, not times: from epoch 2 the partitioned run reads
no storage byte and gets its items from the nodes (some from peers over the shaped links); the
no-cache run reads its share every epoch. Every run, whether it ends normally, by SIGTERM or
by SIGKILL followed by `--cleanup`, leaves no namespace, link, cgroup, segment, temp folder or
process named with the bench's prefix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from coordl.cli.make_dataset import make_dataset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "cluster.py")
IMAGES = 24


def _cluster():
    sys.path.insert(0, os.path.join(REPO, "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_cluster", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(os.path.join(REPO, "bench"))
    return mod


cluster = _cluster()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    why = cluster.why_not()   # root, ip netns, tc htb/tbf, redis-server, blkio (it makes a probe namespace)
    if why is not None:
        pytest.skip(f"cluster bench cannot run here: {why}")
    path = str(tmp_path_factory.mktemp("cluster-data") / "tiny")
    make_dataset(path, images=IMAGES, classes=3, size=(96, 72), quality=85, seed=5, workers=1, progress=False)
    os.sync()
    return path


def _argv(root: str, *extra: str) -> list[str]:
    return [sys.executable, SCRIPT, "--data", root, "--epochs", "2", "--workers", "1", "--batch-size", "4",
            "--size", "64", "--require", *extra]


def _leftovers_gone() -> list[str]:
    deadline = time.monotonic() + 10
    while cluster.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cluster.leftovers()


def test_tiny_cluster_partitioned_reads_no_storage_from_epoch_2_and_cleans_up(root, tmp_path):
    out = str(tmp_path / "cluster")
    # 24 items over 3 nodes: rendezvous hashing may give one node half of them, so the budgets
    # (0.7 of the dataset each) leave room for the largest share, not only for the mean; then 2
    # interleaved pairs with the partitioned and reference clusters both alive
    proc = subprocess.run(_argv(root, "--sides", "partitioned,reference,none", "--budget-fraction", "0.7",
                                "--pairs", "2", "--out", out),
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out + ".json") as f:
        res = json.load(f)
    part, none = res["sides"]["partitioned"], res["sides"]["none"]
    assert len(part) == len(none) == 3 and all(len(rows) == 2 for rows in part + none)
    total = res["dataset_bytes"]
    # epoch 1: the ranks' shares together are the dataset, all from storage, on both sides
    assert sum(rows[0]["storage_bytes"] for rows in part) == total
    assert sum(rows[0]["storage_bytes"] for rows in none) == total
    # epoch 2: partitioned reads nothing from storage; every item is a local or a remote hit
    assert [rows[1]["storage_bytes"] for rows in part] == [0, 0, 0]
    assert sum(rows[1]["remote_hits"] + rows[1]["local_hits"] for rows in part) == IMAGES
    assert sum(rows[1]["remote_bytes"] for rows in part) > 0
    assert sum(rows[1]["storage_bytes"] for rows in none) == total
    assert res["shape"]["partitioned_storage_bytes_from_epoch_2"] == 0
    iv = res["shape"]["interleaved"]
    assert iv["pairs"] == 2 and len(iv["time_ratios"]) == len(iv["cpu_ratios"]) == 2
    assert iv["min_time_ratio"] <= iv["median_time_ratio"] <= iv["max_time_ratio"]
    for side in ("partitioned", "reference"):
        assert len(iv["rows"][side]) == 2 and all(len(pair) == 3 for pair in iv["rows"][side])
        for pair in iv["rows"][side]:   # every item of the epoch from memory: no storage byte
            assert [r["storage_bytes"] for r in pair] == [0, 0, 0]
            assert sum(r["remote_hits"] + r["local_hits"] + r["cache_hits"] for r in pair) >= IMAGES
    assert sum(r["remote_hits"] + r["local_hits"] for pair in iv["rows"]["partitioned"] for r in pair) == 2 * IMAGES
    md = open(out + ".md").read()
    assert "| partitioned | 2 |" in md and "Interleaved pairs (2 epochs" in md
    assert _leftovers_gone() == []


def test_sigterm_mid_run_removes_every_object(root):
    proc = subprocess.Popen(_argv(root, "--sides", "partitioned"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:   # the nodes and ranks are up once an epoch has ended
            if "partitioned epoch 1" in line:
                break
        assert cluster.namespaces(), "the run built no namespace"
        proc.send_signal(signal.SIGTERM)
        proc.stdout.read()
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert _leftovers_gone() == []


def test_sigkill_leaves_objects_that_cleanup_removes(root):
    proc = subprocess.Popen(_argv(root, "--sides", "partitioned"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "partitioned epoch 1" in line:
                break
        proc.kill()
        proc.wait()
    finally:
        proc.stdout.close()
    assert cluster.namespaces(), "a SIGKILLed run leaves its namespaces (and their processes) behind"
    done = subprocess.run([sys.executable, SCRIPT, "--cleanup", "--require"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _leftovers_gone() == []


def test_a_side_with_no_measurable_cpu_gives_no_ratio_rather_than_a_crash():
    # /proc counts CPU in 10 ms ticks: a tiny epoch can show 0 s for the whole reference side
    # (CI: ZeroDivisionError in run_pairs); the ratio is then None and the markdown says why
    assert cluster.cpu_ratio(0.02, 0.0) is None
    assert cluster.cpu_ratio(0.03, 0.02) == 1.5
    assert cluster._ratio_text(None).startswith("n/a") and cluster._ratio_text(1.5) == "1.5"
