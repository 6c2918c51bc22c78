"""bench/gpu_train.py: --help, and a tiny CPU run of every feed that loads here (a real training loop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu_train.py")


def test_help_names_the_feeds():
    run = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "synthetic" in run.stdout and "--model" in run.stdout


def test_tiny_cpu_run_measures_each_feed(photo_root, tmp_path):
    out = str(tmp_path / "r")
    run = subprocess.run([sys.executable, SCRIPT, photo_root, "--model", "tiny", "--device", "cpu",
                          "--feeds", "synthetic,coordl-cpu,coordl-gpu,torch", "--decoder", "cpu",
                          "--batch-size", "4", "--size", "32", "--workers", "1", "--steps", "3", "--warmup", "1",
                          "--out", out], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    with open(out + ".json") as f:
        results = json.load(f)["results"]
    for feed in ("synthetic", "coordl-cpu", "coordl-gpu"):
        r = results[feed]
        assert r["batches"] == 10 and r["images_per_s"] > 0 and 0 <= r["wait_share"] <= 1 and r["cpu_cores"] > 0
    assert "skipped" in results["torch"] or results["torch"]["images_per_s"] > 0
    assert "coordl-gpu" in run.stdout and "of synth" in run.stdout
