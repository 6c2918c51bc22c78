"""Accelerate and Lightning over an s3:// ImageFolder (a real moto server): the jobs of
tests/integrations/jobs/ run unchanged with the bucket's URL as their root and the store in the
AWS_* environment variables. Accelerate's `prepare()` keeps coordl's cache and counters (epoch 2
GETs exactly the bytes a half-size MinIO cache did not take) and coordl's plan; Lightning gets the
local copy's steps and resumes mid-epoch from a checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import coordl_tests_jobs as jobs
import pytest

from coordl.cli.make_dataset import make_dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import TESTS, s3server  # noqa: E402

JOB = os.path.join(TESTS, "integrations", "jobs", "accelerate_job.py")


def _ids_in_bucket(moto_server, tmp_path, bucket: str) -> tuple[str, dict]:
    """30 JPEGs, one per class (a label is its index), in a local folder and at s3://<bucket>/train;
    the environment a job finds the store in (AWS_* variables)."""
    root = str(tmp_path / "ids")
    make_dataset(root, images=30, classes=30, size=(64, 48), quality=85, seed=4, workers=1, progress=False)
    s3server.upload_folder(moto_server, bucket, root, "train")
    return root, dict(AWS_ENDPOINT_URL=moto_server.url, AWS_ACCESS_KEY_ID=s3server.TEST_KEY,
                      AWS_SECRET_ACCESS_KEY=s3server.TEST_SECRET, AWS_DEFAULT_REGION=s3server.REGION)


def test_accelerate_one_process_over_s3_keeps_the_cache_and_counters(moto_server, tmp_path):
    pytest.importorskip("accelerate")
    root, env = _ids_in_bucket(moto_server, tmp_path, "ids")
    out = tmp_path / "out"
    out.mkdir()
    jobs.run(jobs.command(JOB, ["s3://ids/train", str(out), "3", "cache"]), env)
    rec = json.loads((out / "rank0.json").read_text())
    first, second, third = rec["stats"]
    assert (first["storage_reads"], first["storage_requests"], first["samples"]) == (30, 30, 30)
    uncached = rec["total_bytes"] - rec["cache_bytes"]
    assert 0 < uncached < rec["total_bytes"]
    assert second["storage_bytes"] - first["storage_bytes"] == third["storage_bytes"] - second["storage_bytes"] \
        == uncached
    assert second["storage_requests"] - first["storage_requests"] == 30 - (second["cache_hits"] - first["cache_hits"])
    assert rec["epochs"] == rec["plan"] and rec["digests"] == rec["reference"]


def _lightning(root: str, out, env: dict, *extra: str) -> list:
    out.mkdir()
    job = os.path.join(TESTS, "integrations", "jobs", "lightning_job.py")
    jobs.run(jobs.command(job, [root, str(out), "1", "1", "2", "2", *extra]), env)
    rec = json.loads((out / "steps-rank0.json").read_text())
    assert rec["is_coordl"]
    return rec["steps"]


def _local_steps(root: str) -> list:
    """What lightning_job.py records over `root` in one process, from coordl's own loader in this
    process (as test_lightning_elastic.py checks it: Lightning's steps are the loader's batches):
    [epoch, batch index, item ids, sha256 of the pixels] for 2 epochs."""
    import coordl

    loader = coordl.DataLoader(coordl.ImageFolder(root, transform="train", size=8, seed=7), batch_size=4,
                               shuffle=True, num_workers=2, persistent_workers=True)
    steps = []
    for epoch in range(2):
        for n, (images, labels) in enumerate(loader):
            steps.append([epoch, n, labels.tolist(), hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest()])
    return steps


def test_lightning_over_s3_gives_the_local_batches_and_resumes_mid_epoch(moto_server, tmp_path):
    """lightning_job.py (2 workers, 2 epochs) over s3:// yields the local copy's steps (item ids and
    pixel digests), every item once per epoch; a checkpoint after 3 steps resumes with the rest."""
    pytest.importorskip("lightning")
    root, env = _ids_in_bucket(moto_server, tmp_path, "lids")
    full = _lightning("s3://lids/train", tmp_path / "full", env, "3")
    assert full == _local_steps(root)
    for epoch in range(2):
        assert sorted(i for e, _b, ids, _h in full if e == epoch for i in ids) == list(range(30))
    ckpt = str(tmp_path / "full" / "ckpt" / "step=3.ckpt")
    resumed = _lightning("s3://lids/train", tmp_path / "resumed", env, "0", ckpt)
    assert resumed == full[3:]


def test_accelerate_two_ranks_under_torchrun_over_s3_match_the_local_copy(moto_server, tmp_path):
    """Two DDP ranks (torchrun, gloo) over s3:// read what two ranks over the local copy read:
    the same items per rank and epoch and the same bytes, each sample one GET (no cache)."""
    pytest.importorskip("accelerate")
    root, env = _ids_in_bucket(moto_server, tmp_path, "ids2")
    records = {}
    for side, where in (("s3", "s3://ids2/train"), ("local", root)):
        out = tmp_path / side
        out.mkdir()
        jobs.run(jobs.command(JOB, [where, str(out), "2"], nproc=2), env)
        records[side] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for s3rank, local in zip(records["s3"], records["local"]):
        assert s3rank["world"] == 2
        assert s3rank["epochs"] == local["epochs"] and s3rank["digests"] == local["digests"]
        assert [len(ids) for ids in s3rank["epochs"]] == [16, 16]  # 30 items, 2 ranks, batches of 4
        first, second = s3rank["stats"]
        gets = [st["storage_requests"] - st["storage_retries"] for st in (first, second)]
        assert gets == [16, 32]  # one GET a sample (plus any retry of a slow request, counted apart)
        assert local["stats"][-1]["storage_requests"] == 0  # a local folder makes no requests
    for epoch in range(2):
        assert set(records["s3"][0]["epochs"][epoch]) | set(records["s3"][1]["epochs"][epoch]) == set(range(30))
