"""Accelerate's `prepare()` keeps coordl's cache, counters and batches; sharding happens once."""

import json
import os
import select
import signal
import subprocess
import sys

from coordl.buffers import EXTRA_SLOTS


def _records(out, n):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_one_process_keeps_the_cache_and_counters(ids_root, tmp_path, job):
    job(["accelerate_job.py", ids_root, str(tmp_path), "3", "cache"])
    (rec,) = _records(tmp_path, 1)
    assert rec["type"] == "DataLoaderShard" and not rec["is_coordl"]
    first, second, third = rec["stats"]
    assert first["storage_reads"] == 30 and first["samples"] == 30
    # epoch 2 reads from storage exactly the bytes the half-size cache did not take
    uncached = rec["total_bytes"] - rec["cache_bytes"]
    assert 0 < uncached < rec["total_bytes"]
    assert second["storage_bytes"] - first["storage_bytes"] == uncached
    assert third["storage_bytes"] - second["storage_bytes"] == uncached
    assert second["cache_hits"] - first["cache_hits"] == rec["stats"][2]["cache_hits"] - second["cache_hits"] > 0
    # the prepared loader yields the plan's order and augmentation, epoch by epoch, also from
    # persistent workers (the epoch travels with the indices): coordl's own loader's batches
    assert rec["epochs"] == rec["plan"]
    assert rec["digests"] == rec["reference"] and rec["digests"][0] != rec["digests"][1]
    # Accelerate's iterator is torch's, yet the workers reuse their batch buffers: 3 epochs x 8
    # batches fit in the 2 workers' 2 x 5 buffers (persistent workers, prefetch_factor 2)
    assert third["batch_buffers"] <= 2 * (2 + EXTRA_SLOTS) < 3 * 8


def test_two_processes_under_torchrun_shard_once(ids_root, tmp_path, job):
    job(["accelerate_job.py", ids_root, str(tmp_path), "2"], nproc=2)
    recs = _records(tmp_path, 2)
    assert [r["world"] for r in recs] == [2, 2]
    for epoch in range(2):
        a, b = recs[0]["epochs"][epoch], recs[1]["epochs"][epoch]
        assert set(a) | set(b) == set(range(30))       # covering: sharded once, not twice
        # Accelerate's even_batches pads the last batch from the epoch's head, as
        # DistributedSampler does: 30 items in batches of 4 -> 8 batches, 2 items repeated
        assert len(a) == len(b) == 16
        order = a[:4] + b[:4]                          # the whole epoch's first two batches
        assert sorted(set(a) & set(b)) == sorted(order[:2])
    assert recs[0]["epochs"][0] != recs[0]["epochs"][1]
    # each rank's counters count that rank's samples only
    assert [r["stats"][-1]["samples"] for r in recs] == [32, 32]   # 2 epochs x 16


def test_a_coordinated_loader_takes_the_daemons_batches_through_prepare(ids_root, tmp_path, job):
    sock = str(tmp_path / "d.sock")
    coordl_cmd = os.path.join(os.path.dirname(sys.executable), "coordl")
    daemon = subprocess.Popen([coordl_cmd, "serve", "--data", ids_root, "--batch-size", "4", "--size", "32",
                               "--seed", "3", "--epochs", "2", "--workers", "1", "--join-window", "0",
                               "--socket", sock], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([daemon.stdout], [], [], 60)
        assert ready and "listening" in daemon.stdout.readline()
        job(["accelerate_job.py", ids_root, str(tmp_path), "2", f"coordinator=unix://{sock}"])
        (rec,) = _records(tmp_path, 1)
        assert rec["attached_jobs"] == 1                           # the daemon saw the job attached
        stats = rec["stats"][-1]
        assert stats["batches"] == 16 and stats["samples"] == 60    # received from the daemon
        assert stats["daemon_decodes"] == 60                       # the daemon decoded, 2 epochs x 30
        # the daemon's batches are the plan's: those of coordl's own loader with the same seed
        assert rec["digests"] == rec["reference"]
        assert daemon.wait(60) == 0                                # it served its 2 epochs and stopped
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        daemon.stdout.close()
        daemon.stderr.close()
