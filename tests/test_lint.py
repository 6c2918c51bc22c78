"""ruff over the whole tree: style is checked by a tool in CI, not by review."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_is_clean():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    paths = [p for p in ("coordl", "cache", "pipelines", "bench", "tests") if os.path.isdir(os.path.join(ROOT, p))]
    result = subprocess.run([ruff, "check", *paths],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
