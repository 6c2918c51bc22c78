"""`coordl demo` (the README's first command) runs end to end, leaves nothing behind, and
measures the way bench/loaders.py does (warm-up, interleaved rounds, median of per-round ratios)."""

import os
import subprocess
import sys

import torch

from coordl.cli.demo import interleaved

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")


def test_demo_runs_end_to_end_on_a_small_dataset(tmp_path):
    out = subprocess.run([COORDL, "demo", "--images", "96", "--batch-size", "16", "--epochs", "2"],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.split()[:1] == ["coordl"] and "images/s" in line for line in lines), out.stdout
    assert any(line.strip().startswith("ratio") for line in lines), out.stdout
    assert "'decodes': " in out.stdout and "'batch_buffers': " in out.stdout
    # it says what it measured, and how bench/loaders.py measures the same
    assert "1 warm-up epoch each, then 2 interleaved rounds" in out.stdout
    assert "2 workers each, batch 16" in out.stdout
    assert "median of 2 per-round ratios" in out.stdout and "96 images per epoch" in out.stdout
    assert "bench/loaders.py DIR --loaders coordl,torch-simd --repeats 2 --batch-size 16 --workers 2" \
        in out.stdout


class _Loader:
    """An iterable of batches that records, in a shared log, each epoch it runs."""

    def __init__(self, name: str, log: list[str], batches: int) -> None:
        self.name, self.log, self.batches = name, log, batches

    def __iter__(self):
        self.log.append(self.name)
        for _ in range(self.batches):
            yield torch.zeros(4, 1), torch.zeros(4)


def test_the_demo_times_as_bench_loaders_does_warm_up_then_interleaved_rounds():
    log: list[str] = []
    rates = interleaved({"a": _Loader("a", log, 3), "b": _Loader("b", log, 2)}, rounds=3, settle=0)
    assert log == ["a", "b"] + ["a", "b"] * 3  # one warm-up epoch each (untimed), then rounds
    assert [len(r) for r in rates.values()] == [3, 3]  # the timed epochs only
    assert all(r > 0 for rs in rates.values() for r in rs)
