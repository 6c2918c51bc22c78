"""Coordinated jobs resume from a checkpoint: real daemons, real job processes (resume_job.py).

A job is interrupted (its state saved as JSON, then SIGKILL), a fresh process loads the
state and must receive exactly the batches an uninterrupted job received from that point,
byte for byte (sha256 of the image, label and id bytes), and with --epochs exactly the
epochs it had left. The tiny dataset has 40 items: 10 batches of 4 per epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import coordl_tests_forked as forked
import pytest
import torch

import coordl
from coordl.errors import ConfigError, CoordinatorError

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_job.py")
BPE = 10


class ResumeJob:
    def __init__(self, tmp_path, name: str, root: str, served, **args) -> None:
        self.out = str(tmp_path / f"{name}.json")
        spec = {"root": root, "socket": served.socket, "iterations": 2, "out": self.out, **args}
        self.proc = forked.script(JOB, [json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)

    def wait_for(self, text: str) -> None:
        for line in self.proc.stdout:  # the job prints and flushes a line per event
            if line.strip() == text:
                return
        self.proc.wait(60)
        pytest.fail(f"job never printed {text!r} (exit {self.proc.returncode}): "
                    f"{self.proc.stderr.read()}")

    def result(self) -> dict:
        self.proc.stdout.read()  # drain, so that the job never blocks on a full pipe
        self.proc.wait(120)
        err = self.proc.stderr.read()
        assert self.proc.returncode == 0, err
        with open(self.out) as f:
            return json.load(f)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def resume_jobs(tmp_path):
    started: list[ResumeJob] = []

    def start(name, root, served, **args) -> ResumeJob:
        job = ResumeJob(tmp_path, name, root, served, **args)
        started.append(job)
        return job

    yield start
    for job in started:
        job.reap()


def _fifo(tmp_path, name="hold"):
    path = str(tmp_path / name)
    os.mkfifo(path)
    return path


def _release(fifo: str) -> None:
    with open(fifo, "w") as f:
        f.write("go\n")


@pytest.mark.parametrize("k", [1, 5, 10], ids=["first", "middle", "last"])
def test_resumed_after_a_kill_gets_the_rest_byte_for_byte_prepared_again(tiny_root, serve,
                                                                         resume_jobs, tmp_path, k):
    """The interrupted job's batch has left the ring when the fresh job attaches: the daemon
    prepares it again, and the fresh job gets exactly the batches of the uninterrupted one."""
    served = serve(tiny_root, epochs=2, min_jobs=2)
    fifo = _fifo(tmp_path)
    ref = resume_jobs("ref", tiny_root, served, hold_at=[1, BPE], hold=fifo)
    state = str(tmp_path / "state.json")
    cut = resume_jobs("cut", tiny_root, served, save_at=[0, k], state_out=state)
    cut.wait_for("saved")
    cut.kill()  # a preemption: SIGKILL, holds released by the daemon
    ref.wait_for(f"batch 1 {BPE}")  # ref has received all 20 batches and holds the last one
    with open(state) as f:
        text = f.read()
    saved = json.loads(text)
    assert len(text) < 400 and saved["version"] == 1
    epoch, batches = (1, 0) if k == BPE else (0, k)  # a whole epoch received: the next one
    assert (saved["epoch"], saved["batches"], saved["coordinator"]) == (epoch, batches,
                                                                        {"start_epoch": 0})
    assert served.status()["produced_batches"] == 2 * BPE
    again = resume_jobs("again", tiny_root, served, state_in=state,
                        iterations=2 - epoch).result()
    _release(fifo)
    want = ref.result()
    assert len(want["batches"]) == 2 * BPE and [b[1] for b in want["batches"]] == list(range(20))
    assert again["state_at_start"]["epoch"] == epoch
    assert again["state_at_start"]["batches"] == batches
    assert again["batches"] == want["batches"][k:]  # same epochs, indices and bytes
    assert "had its 2 epochs" in again["error"]  # then exactly the epochs it had left: no more
    # batches k..18 left the ring and were prepared again; 19 was still held by ref
    assert again["stats"]["daemon_batches"] == 2 * BPE + (2 * BPE - 1 - k)
    assert again["states"][-1]["epoch"] == 2 and again["states"][-1]["batches"] == 0


def test_resumed_while_its_batch_is_still_in_the_ring_shares_it(tiny_root, serve, resume_jobs,
                                                                tmp_path):
    served = serve(tiny_root, epochs=2, min_jobs=2, slots=8)
    fifo = _fifo(tmp_path)
    ref = resume_jobs("ref", tiny_root, served, hold_at=[0, 1], hold=fifo)
    state = str(tmp_path / "state.json")
    cut = resume_jobs("cut", tiny_root, served, save_at=[0, 3], state_out=state)
    cut.wait_for("saved")
    ref.wait_for("batch 0 1")  # ref holds batches 0..7 (its run): batch 3 stays in the ring
    cut.kill()
    again = resume_jobs("again", tiny_root, served, state_in=state)
    again.wait_for("attached")  # resumed: it holds batch 3 and what follows
    _release(fifo)
    got, want = again.result(), ref.result()
    assert got["batches"] == want["batches"][3:]
    assert "had its 2 epochs" in got["error"]
    assert got["stats"]["daemon_batches"] == 2 * BPE  # nothing was prepared twice


# -- in this process: what load_state_dict refuses --
def _loader(root, served, **kw):
    ds = coordl.ImageFolder(root, transform="train", size=32, seed=kw.pop("seed", 0))
    return coordl.DataLoader(ds, batch_size=4, shuffle=True, timeout=60,
                             coordinator=served.address, **kw)


def _changed(state, **changes):
    state = json.loads(json.dumps(state))
    for key, value in changes.items():
        if key in ("version", "epoch", "batches", "coordinator"):
            state[key] = value
        else:
            state["identity"][key] = value
    return state


@pytest.mark.parametrize("change, words", [
    (dict(dataset="0" * 64), ["dataset: saved '000000", "this loader '"]),
    (dict(items=41), ["items: saved 41, this loader 40"]),
    (dict(seed=5), ["seed: saved 5, this loader 0"]),
    (dict(batch_size=8), ["batch_size: saved 8, this loader 4"]),
    (dict(shuffle=False), ["shuffle: saved False, this loader True"]),
    (dict(version=99), ["state version 99 is not known", "reads version 1"]),
    (dict(batches=-1), ["batches=-1"]),
    (dict(coordinator={"start_epoch": 3}), ["start_epoch=3", "the state's epoch 0"]),
])
def test_a_state_that_would_give_other_batches_is_refused_naming_it(tiny_root, serve, change, words):
    served = serve(tiny_root)
    loader = _loader(tiny_root, served)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    with pytest.raises(ConfigError) as e:
        loader.load_state_dict(_changed(state, **change))
    for w in words:
        assert w in str(e.value)
    loader.load_state_dict(state)  # the job is still attached and can resume
    assert [b.index for b in loader] == list(range(BPE))
    loader.coordinator.close()


def test_load_state_dict_after_an_epoch_began_is_refused_and_a_fresh_loader_resumes(tiny_root,
                                                                                    serve):
    served = serve(tiny_root)
    loader = _loader(tiny_root, served)
    it = iter(loader)
    assert [next(it).index for _ in range(4)] == [0, 1, 2, 3]
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 4)  # received, not the Next sent ahead
    with pytest.raises(ConfigError, match="build a fresh DataLoader"):
        loader.load_state_dict(state)
    loader.coordinator.close()
    fresh = _loader(tiny_root, served)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["batches"] == 4  # a state loaded, not yet iterated, saves as is
    assert [b.index for b in fresh] == list(range(4, BPE))
    assert [b.index for b in fresh] == list(range(BPE, 2 * BPE))
    fresh.coordinator.close()


def test_a_local_loaders_state_resumes_a_coordinated_job_and_back(tiny_root, serve):
    """One plan: a local coordl.DataLoader and the daemon yield the same batches, so their
    states are interchangeable (a local state's first epoch counts as 0)."""
    served = serve(tiny_root)
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=0)

    def local(state):
        loader = coordl.DataLoader(ds, batch_size=4, shuffle=True)
        loader.load_state_dict(state)
        return [(x.contiguous(), y) for x, y in loader]

    first = coordl.DataLoader(ds, batch_size=4, shuffle=True)
    it = iter(first)
    for _ in range(6):
        next(it)
    job = _loader(tiny_root, served)
    job.load_state_dict(first.state_dict())
    got = [(b.index, b[0].clone(), b[1].clone()) for b in job]
    want = local(first.state_dict())
    assert [g[0] for g in got] == list(range(6, BPE)) and len(want) == BPE - 6
    for (_, x, y), (wx, wy) in zip(got, want):
        assert x.contiguous().numpy().tobytes() == wx.numpy().tobytes() and torch.equal(y, wy)
    it = iter(job)  # epoch 1: save after 2 batches, go on locally
    next(it), next(it)
    state = job.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 2)
    rest = [(b[0].contiguous().clone(), b[1].clone()) for b in it]
    want = local(state)
    assert len(rest) == len(want) == BPE - 2
    for (x, y), (wx, wy) in zip(rest, want):
        assert x.numpy().tobytes() == wx.numpy().tobytes() and torch.equal(y, wy)
    job.coordinator.close()


def test_a_refusal_by_the_daemon_raises(tiny_root, serve):
    served = serve(tiny_root, epochs=1)
    loader = _loader(tiny_root, served)
    state = _changed(loader.state_dict(), epoch=1)  # epoch 1 of a job whose first was 0
    loader.load_state_dict(state)  # accepted: the job had one epoch, and it is over
    with pytest.raises(CoordinatorError, match="had its 1 epochs"):
        iter(loader)
