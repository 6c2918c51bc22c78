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
