"""bench/gpu_check.py: without a GPU it exits 2 saying so; with --device cpu it runs its checks end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("nvidia.dali")

from coordl.loader import dali as dali_loader  # noqa: E402 (after the skip: without DALI there is nothing to check)

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu_check.py")


@pytest.mark.skipif(dali_loader.gpu_count() > 0, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_measures_nothing(tmp_path):
    root = str(tmp_path / "never-made")
    run = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "no GPU" in run.stderr and "nothing was measured" in run.stderr
    assert not os.path.exists(root)                      # no dataset made, nothing run


def test_cpu_dry_run_checks_shapes_labels_and_pixels(photo_root, tmp_path):
    out = str(tmp_path / "result")
    run = subprocess.run([sys.executable, SCRIPT, photo_root, "--device", "cpu", "--workers", "1",
                          "--epochs", "1", "--batch-size", "8", "--out", out],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    with open(out + ".json") as f:
        result = json.load(f)
    assert result["check"]["train"]["batches"] == result["check"]["val"]["batches"] == 3
    assert min(result["check"][t]["min_psnr_db"] for t in ("train", "val")) >= 30.0
    assert set(result["speed"]) == {"coordl+dali (cpu)", "coordl cpu backend", "plain dali (cpu)"}
    assert all(len(s["images_per_s"]) == 1 for s in result["speed"].values())
