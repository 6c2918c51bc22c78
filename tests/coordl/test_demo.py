"""`coordl demo` (the README's first command) runs end to end and leaves nothing behind."""

import os
import subprocess
import sys

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")


def test_demo_runs_end_to_end_on_a_small_dataset(tmp_path):
    out = subprocess.run([COORDL, "demo", "--images", "96", "--batch-size", "16", "--epochs", "1"],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.split()[:1] == ["coordl"] and line.endswith("images/s") for line in lines), out.stdout
    assert any(line.strip().startswith("ratio") for line in lines), out.stdout
    assert "'decodes': " in out.stdout and "'batch_buffers': " in out.stdout
