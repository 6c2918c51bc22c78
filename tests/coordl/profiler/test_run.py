"""coordl/profiler/run.py's pure parts: the timed steps fitted to a dataset's size."""

from __future__ import annotations

from coordl.profiler import run


def test_steps_fit_the_dataset():
    # the demo's 600 images at batch 64: 9 batches, 2 of them warm-up: 7 timed steps, not 10
    assert run.fit_steps(600, 64) == 7
    assert run.fit_steps(10_000, 64) == run.DEFAULT_STEPS == 10
    assert run.fit_steps(40, 8) == 3 and run.fit_steps(40, 30) == 1  # too small: profile() says what to change
    assert run.fit_steps(10_000, 64, wanted=13) == 13
    line = run.fitted_steps_line(600, 64, 7)
    assert line.startswith("7 timed steps per run, not 10: the dataset's 600 items") and "batch 64" in line
