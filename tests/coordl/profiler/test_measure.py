"""coordl/profiler/measure.py: the workers' CPU is read from the live worker processes."""

from __future__ import annotations

import os

import pytest
import torch

import coordl
from coordl.profiler import measure


def test_workers_cpu_reads_each_live_worker(tiny_root):
    ds = coordl.ImageFolder(tiny_root, size=32)
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=2)
    it = iter(loader)
    try:
        next(it)
        assert len(it._workers) == 2
        first = measure.workers_cpu(it, loader.stats)
        for _ in range(8):
            next(it)
        last = measure.workers_cpu(it, loader.stats)
        assert first is not None and last is not None
        # decoded: at least what was consumed (1 batch, then 9), at most the 40 items
        assert 0 <= first[0] <= last[0] and 4 <= first[1] <= last[1] and 36 <= last[1] <= 40
        assert measure.workers_cpu(it)[1] == 0  # no counters: no count
        for _ in it:
            pass
    finally:
        it._shutdown_workers()
    # no worker processes (num_workers=0), or none left to read: None, and loader_rate falls back
    assert measure.workers_cpu(iter(coordl.DataLoader(ds, batch_size=4))) is None
    assert measure.workers_cpu(it) is None


def test_train_rate_per_sample_cpu_of_the_workers():
    # read when the first batch came, when the timing starts, when it ends
    ticks = iter([(0.5, 4), (1.0, 8), (3.0, 24)])
    batches = [[None, list(range(4))]] * 5
    t = measure.train_rate(batches, None, 1, 4, 4, lambda: None, "t", False, children=lambda: next(ticks))
    # per item prepared from the first batch on (prefetching can leave few items to the timed steps)
    assert t.samples == 16 and t.cpu_children == 2.5 / 20
    # 2 s of the workers' CPU over a window of microseconds is more than the cores can do: such a
    # reading (a clock's tick error over a short window, measure.py) is reported as the cores
    assert t.cores_busy == len(os.sched_getaffinity(0))
    t = measure.train_rate(batches, None, 1, 4, 4, lambda: None, "t", False, children=lambda: None)
    assert t.cpu_children != t.cpu_children  # nan: unknown
    t = measure.train_rate(batches, None, 1, 4, 4, lambda: None, "t", False, children=lambda: (1.0, 8))
    assert t.cpu_children != t.cpu_children  # no item prepared meanwhile: unknown
    t = measure.train_rate(batches, None, 1, 4, 4, lambda: None, "t", False)
    assert t.cpu_children == 0.0 and t.cores_busy >= 0


def test_process_cpu_reads_another_process(tmp_path):
    import os
    import subprocess
    import sys
    import time
    p = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                          "while time.process_time() - t < 0.2: pass\nprint(1, flush=True)\ntime.sleep(30)"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "1"
        cpu = measure.process_cpu(p.pid)
        assert cpu is not None and 0.2 <= cpu < 30  # its own CPU, not this process's
        assert measure.process_cpu(os.getpid()) == pytest.approx(time.process_time(), abs=0.05)
    finally:
        p.kill()
        p.wait()
    assert measure.process_cpu(p.pid) is None  # gone


def test_no_progress_bars_where_stderr_is_not_a_terminal(capfd):
    # pytest's capture: stderr is a file, as in a log; the bar would write its redraws there
    batches = [[torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4, dtype=torch.int64)]] * 4
    t = measure.train_rate(batches, lambda b: b[0].float().mean(), 1, 3, 4, lambda: None, "bars?", True)
    assert t.batches == 3
    out, err = capfd.readouterr()
    assert err == "" and out == ""
    assert not measure.bars_shown(True) and not measure.bars_shown(False)
