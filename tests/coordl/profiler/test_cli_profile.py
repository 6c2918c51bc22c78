"""`coordl profile` as a user runs it: a real process, its JSON and PNG, its errors, and Ctrl-C
(a real SIGINT) in the middle of a measurement leaving nothing in the shared-memory folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import coordl_tests_forked as forked
import pytest

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")

STEP_MODULE = '''
import os, time, torch

def step(batch):
    return batch[0].float().mean()

def none_step(batch):
    return None

def stall_in_cached_run(batch):
    """Runs normally until the profiler's all-items cache exists, then says so and waits."""
    name = os.path.join(os.environ["COORDL_SHM_DIR"], "coordl-cache-profile-%d-all" % os.getpid())
    if os.path.exists(name):
        with open(os.environ["MARK"], "w") as f:
            f.write(name)
        while True:
            time.sleep(0.05)
    return batch[0].float().mean()

def busy_in_cached_run(batch):
    """As stall_in_cached_run, but in a run with loader workers, and it waits in C code that does
    not look at signals (a model's step): a signal to the process group then finds the workers
    dead when the parent's handlers run."""
    import multiprocessing
    name = os.path.join(os.environ["COORDL_SHM_DIR"], "coordl-cache-profile-%d-all" % os.getpid())
    if os.path.exists(name) and multiprocessing.active_children():
        torch.set_num_threads(1)
        a = torch.ones(1200, 1200)
        with open(os.environ["MARK"], "w") as f:
            f.write(name)
        while True:
            torch.mm(a, a)
    return batch[0].float().mean()
'''


@pytest.fixture
def steps_dir(tmp_path):
    (tmp_path / "mysteps.py").write_text(STEP_MODULE)
    return tmp_path


def run(args, cwd, env=None, executable=False):
    """`coordl profile ARGS` in cwd: the installed executable, or (most tests: the same click
    command, without an interpreter start and torch import) forked from this process."""
    if executable:
        return subprocess.run([COORDL, "profile", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=240, env=env)
    return forked.run(["profile", *args], cwd=cwd, env=env, timeout=240)


def test_cli_writes_table_json_and_png(tiny_root, steps_dir):
    out, png = steps_dir / "p.json", steps_dir / "p.png"
    p = run(["--data", tiny_root, "--train-step", "mysteps:step", "--batch-size", "4", "--workers", "1",
             "--steps", "2", "--validate", "--json", str(out), "--plot", str(png)], steps_dir, executable=True)
    assert p.returncode == 0, p.stderr
    assert "fetch stall" in p.stdout and "what if: cache size" in p.stdout
    d = json.loads(out.read_text())
    assert set(d["rates"]) == {"ingestion", "prep", "fetch"}
    assert {"fetch_stall_pct", "prep_stall_pct", "what_if", "validation"} <= set(d)
    assert len(d["validation"]) == 2
    for v in d["validation"]:
        assert {"config", "predicted", "measured", "error_pct"} <= set(v)
        assert len(v["measured_rounds"]) == 1 and v["measured_rounds"][0] == v["measured"]
    assert d["settings"]["model"] == "mysteps:step"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert d["verdict"]["text"] in p.stdout and "advice (from the model's predictions):" in p.stdout
    assert isinstance(d["advice"], list) and d["advice"]
    assert 0 < d["measured"]["cpu_cores_busy"] <= len(os.sched_getaffinity(0))


def test_cli_builtin_model_runs(tiny_root, tmp_path):
    p = run(["--data", tiny_root, "--model", "small-cnn", "--batch-size", "4", "--workers", "1",
             "--steps", "1"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "model small-cnn" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "vgg"], "model='vgg' is not a built-in model (small-cnn, resnet18), and torchvision"),
    (["--train-step", "mysteps:none_step"], "returned NoneType"),
    (["--train-step", "mysteps:nothere"], "mysteps has no function 'nothere'"),
    (["--train-step", "nomodule:f"], "cannot import module 'nomodule'"),
    (["--steps", "50"], "pass steps <= 8 (--steps)"),
    (["--cache", "lots"], "--cache='lots' is not a size"),
    (["--cache-bytes", "lots"], "--cache='lots' is not a size"),  # the old name, an alias
    (["--threads", "-3"], "--threads=-3 must be an int >= 1"),
    (["--threads", "0"], "--threads=0 must be an int >= 1"),
    (["--workers", "0"], "--workers=0 must be an int >= 1"),
    (["--batch-size", "-1"], "--batch-size=-1 must be an int >= 1"),
    (["--steps", "0"], "--steps=0 must be an int >= 1"),
    (["--repeats", "0"], "--repeats=0 must be an int >= 1"),
    (["--json", "nofolder/p.json"], "--json nofolder/p.json: the folder nofolder does not exist"),
    (["--plot", "nofolder/p.png"], "--plot nofolder/p.png: the folder nofolder does not exist"),
    (["--json", "mysteps.py/p.json"], "--json mysteps.py/p.json: mysteps.py is not a folder"),
    (["--json", "."], "--json .: is a folder"),
    (["--json", "same.out", "--plot", "same.out"], "--json and --plot are both same.out"),
])
def test_cli_bad_input_says_what_to_change(tiny_root, steps_dir, args, message):
    p = run(["--data", tiny_root, "--batch-size", "4", "--workers", "1", "--steps", "1", *args], steps_dir)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr
    assert "Traceback" not in p.stderr
    if "--json" in args or "--plot" in args:  # refused before the run: nothing measured
        assert "rates (samples/s" not in p.stdout and "ingestion" not in p.stderr


def test_cli_fits_the_steps_to_the_dataset_and_says_so(tiny_root, steps_dir):
    # 40 items at batch 8: 5 batches, 2 warm-up: 3 timed steps (the default 10 needs 96 items)
    out = steps_dir / "fit.json"
    p = run(["--data", tiny_root, "--train-step", "mysteps:step", "--batch-size", "8", "--workers", "1",
             "--json", str(out)], steps_dir)
    assert p.returncode == 0, p.stderr
    assert "coordl profile: 3 timed steps per run, not 10: the dataset's 40 items" in p.stderr
    assert json.loads(out.read_text())["settings"]["steps"] == 3
    assert "3 timed steps per run" in p.stdout


def test_cli_cache_flag_and_its_old_name(tiny_root, steps_dir):
    for flag in ("--cache", "--cache-bytes"):
        out = steps_dir / f"c{flag}.json"
        p = run(["--data", tiny_root, "--train-step", "mysteps:step", "--batch-size", "4", "--workers", "1",
                 "--steps", "1", flag, "64KiB", "--json", str(out)], steps_dir)
        assert p.returncode == 0, p.stderr
        assert json.loads(out.read_text())["settings"]["cache_bytes"] == 64 * 1024


def test_cli_cuda_without_gpu(tiny_root, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    p = run(["--data", tiny_root, "--device", "cuda", "--batch-size", "4", "--steps", "1"], tmp_path)
    assert p.returncode == 2 and "no CUDA GPU is visible" in p.stderr and "--device cpu" in p.stderr


# through a launcher that sets SIGINT and SIGTERM to their defaults first: a test run started in
# the background of a script inherits SIGINT ignored, and Python then never raises
# KeyboardInterrupt (Ctrl-C in a terminal always has the default)
LAUNCH = ("import os, signal, sys; [signal.signal(s, signal.SIG_DFL) for s in (1, 2, 15)]; "
          "os.execv(sys.argv[1], sys.argv[1:])")


def _stalled_profile(steps_dir, tiny_root, group: bool, step: str = "stall_in_cached_run"):
    """`coordl profile` with 2 loader workers, stalled in its all-cached run: (process, segment)."""
    mark = steps_dir / "mark"
    env = {**os.environ, "MARK": str(mark)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, COORDL, "profile", "--data", tiny_root, "--train-step",
                             f"mysteps:{step}", "--batch-size", "4", "--workers", "2", "--steps", "2"],
                            cwd=steps_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=group)
    deadline = time.monotonic() + 180
    while not mark.exists():  # the step writes it once the cache segment exists
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the profile never reached its cached run: {proc.communicate()}")
        time.sleep(0.05)
    segment = mark.read_text()
    assert os.path.exists(segment)
    return proc, segment


def _ended(proc) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _no_profile_segments(pid: int) -> None:
    left = os.listdir(os.environ["COORDL_SHM_DIR"])
    assert not [n for n in left if n.startswith(f"coordl-cache-profile-{pid}-")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupt_removes_the_temporary_caches(tiny_root, steps_dir, sig):
    proc, segment = _stalled_profile(steps_dir, tiny_root, group=False)
    proc.send_signal(sig)
    _out, err = _ended(proc)
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err
    assert not os.path.exists(segment)
    _no_profile_segments(proc.pid)


def test_sigterm_to_the_whole_process_group_ends_as_to_the_parent_alone(tiny_root, steps_dir):
    # as `timeout` sends it: the loader's workers get it too and die of it; the parent must end
    # as it does alone (143, one line, caches removed), not with the workers' death chained onto it
    proc, segment = _stalled_profile(steps_dir, tiny_root, group=True, step="busy_in_cached_run")
    os.killpg(proc.pid, signal.SIGTERM)
    _out, err = _ended(proc)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "terminated (SIGTERM)" in err and "temporary caches are removed" in err
    assert not os.path.exists(segment)
    _no_profile_segments(proc.pid)
