"""bench/objstore.py still runs, on a handful of images: both readers fetch every object (counted at the proxy)."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_objstore_runs_on_a_few_images():
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "objstore.py"), "--images", "8", "--classes", "2",
                          "--size", "96x72", "--latency", "0.005", "--batch", "4"],
                         capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "coordl read_many" in out.stdout and "8 GETs" in out.stdout and "ratio:" in out.stdout


def test_bench_objstore_loaders_run_on_a_few_images():
    """--loaders: the three loaders each GET every object every epoch (counted at the proxy), and the
    half-size MinIO cache GETs fewer than all in its later epochs, the same number in each."""
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "objstore.py"), "--loaders", "--images", "12",
                          "--classes", "2", "--size", "96x72", "--latency", "0.005", "--batch", "4", "--epochs", "1"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {line.split()[0] + " " + line.split()[1]: line for line in out.stdout.splitlines()[1:4]}
    assert "12 GETs/epoch" in lines["coordl s3"] and "12 GETs/epoch" in lines["torch s3fs"]
    assert "0 GETs/epoch" in lines["coordl local"]
    gets = out.stdout.split("GETs per epoch [")[1].split("]")[0].split(", ")
    assert gets[0] == "12" and gets[1] == gets[2] and 0 < int(gets[1]) < 12
