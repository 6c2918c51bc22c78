"""`coordl serve --dataset` for samples that are not images (coordinator/spec.py): coordl.AudioFolder's
float32 (channels, samples) waveforms and a user's float32 vectors, served by their sample spec to
real job processes, batch for batch the bytes of a local coordl.DataLoader, each batch prepared once;
a job whose dataset's samples differ is refused naming both specs; a sample of another shape fails
its batch naming the item, both specs and the fix."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys

import coordl_tests_forked as forked
import numpy as np
import pytest
import torch

import coordl
from coordl.coordinator import client, segments

sf = pytest.importorskip("soundfile")

HERE = os.path.dirname(os.path.abspath(__file__))
COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")
SAMPLE_JOB = os.path.join(HERE, "sample_job.py")
AUDIO = "coordl.datasets.audio:AudioFolder"
RATE, SECONDS, BATCH, SEED = 16000, 0.5, 4, 3


def _vectors_class():
    """vectors.py's Vectors, as the module "vectors" (the name the daemon imports it by)."""
    spec = importlib.util.spec_from_file_location("vectors", os.path.join(HERE, "vectors.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Vectors


@pytest.fixture
def audio_root(tmp_path) -> str:
    """Ten mono 16 kHz files in two classes, WAV and FLAC, two shorter than the 0.5 s window."""
    root = tmp_path / "audio"
    for k in range(10):
        cls = root / ("noise" if k % 2 else "tone")
        cls.mkdir(parents=True, exist_ok=True)
        frames = 4000 + 1500 * k  # 0.25 s .. 1.09 s
        data = np.random.default_rng(k).uniform(-0.5, 0.5, (frames, 1)).astype(np.float32)
        ext, subtype = (".wav", "FLOAT") if k % 3 else (".flac", "PCM_16")
        sf.write(str(cls / f"{k}{ext}"), data, RATE, subtype=subtype)
    return str(root)


class Daemon:
    """One `coordl serve --dataset ...` process, its socket and log in `sockdir`."""

    def __init__(self, sockdir: str, dataset: str, args: dict, *flags: str) -> None:
        self.socket = os.path.join(sockdir, "s.sock")
        self.log = self.socket + ".err"
        env = {**os.environ, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
        argv = [COORDL, "serve", "--dataset", dataset, "--dataset-args", json.dumps(args),
                "--batch-size", str(BATCH), "--seed", str(SEED), "--socket", self.socket, *flags]
        with open(self.log, "w") as err:
            self.proc = forked.coordl(argv[1:], stdout=subprocess.PIPE, stderr=err, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if "listening" not in line:
            self.stop()
            pytest.fail(f"coordl serve did not start: {line!r}\n{self.log_text()}")
        self.address = "unix://" + self.socket
        st = self.status()
        self.pid, self.workers = st["pid"], st["workers"]

    def status(self) -> dict:
        return client.status(self.socket)

    def log_text(self) -> str:
        with open(self.log) as f:
            return f.read()

    def segments_left(self) -> list[str]:
        prefix = segments.daemon_prefix(self.pid)
        return [n for n in os.listdir(segments.SHM_DIR) if n.startswith(prefix)]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        if not self.proc.stdout.closed:
            self.proc.stdout.close()
        return code


@pytest.fixture
def daemons(sockdir):
    """daemons(dataset, args, *flags) -> Daemon; each is stopped after the test."""
    started: list[Daemon] = []

    def start(dataset: str, args: dict, *flags: str) -> Daemon:
        started.append(Daemon(sockdir, dataset, args, *flags))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def _job(tmp_path, k: int, daemon: Daemon, dataset: str, args: dict, epochs: int) -> tuple[subprocess.Popen, str]:
    out = str(tmp_path / f"job{k}.json")
    spec = {"dataset": dataset, "args": args, "seed": SEED, "socket": daemon.socket,
            "batch_size": BATCH, "epochs": epochs, "out": out}
    env = {**os.environ, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = forked.script(SAMPLE_JOB, [json.dumps(spec)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    return proc, out


def _result(proc: subprocess.Popen, out: str) -> dict:
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err = proc.stderr.read()
        proc.stderr.close()
    with open(out) as f:
        result = json.load(f)
    assert code == 0 and result["error"] is None, (result["error"], err)
    return result


def _local(ds, epochs: int) -> list[list[dict]]:
    """What a plain coordl.DataLoader over `ds` gives, epoch by epoch: the sample_job.py digests."""
    loader = coordl.DataLoader(ds, batch_size=BATCH, shuffle=True)
    out = []
    for _ in range(epochs):
        epoch = []
        for samples, labels in loader:
            h = hashlib.sha256()
            for t in (samples, labels):
                h.update(t.contiguous().numpy().tobytes())
            epoch.append({"digest": h.hexdigest(), "shape": list(samples.shape), "dtype": str(samples.dtype)})
        out.append(epoch)
    return out


def _served(result: dict) -> list[list[dict]]:
    return [[{k: b[k] for k in ("digest", "shape", "dtype")} for b in e["batches"]] for e in result["epochs"]]


def _two_jobs_get_the_local_batches(tmp_path, daemons, dataset: str, args: dict, local_ds, items: int) -> dict:
    """Two job processes over `dataset` at a daemon with --epochs 2 --min-jobs 2: each gets the local
    loader's batches, byte for byte, and the daemon prepares each batch once for both; it stops by
    itself when they have left and leaves nothing in /dev/shm. The daemon's last status."""
    daemon = daemons(dataset, args, "--epochs", "2", "--min-jobs", "2", "--workers", "2")
    jobs = [_job(tmp_path, k, daemon, dataset, args, epochs=2) for k in range(2)]
    results = [_result(*job) for job in jobs]
    expected = _local(local_ds, 2)
    batches = -(-items // BATCH)
    assert [len(e) for e in expected] == [batches, batches]
    for result in results:
        assert result["start_epoch"] == 0
        assert _served(result) == expected  # exact bytes of samples and labels, in order
    st = results[-1]["status"]
    assert st["produced_batches"] == 2 * batches and st["produced_images"] == 2 * items  # once for both
    assert daemon.proc.wait(60) == 0, daemon.log_text()  # --epochs: it stops once both have left
    assert daemon.segments_left() == []
    return st


def test_audio_folder_is_served_to_two_jobs_as_a_local_loader_gives_it(tmp_path, daemons, audio_root):
    args = {"root": audio_root, "seconds": SECONDS}
    ds = coordl.AudioFolder(audio_root, seconds=SECONDS, seed=SEED)
    st = _two_jobs_get_the_local_batches(tmp_path, daemons, AUDIO, args, ds, len(ds))
    assert (st["sample_shape"], st["sample_dtype"], st["size"]) == ([1, 8000], "float32", 0)
    assert st["transform"] == AUDIO + " [transform='train']" and st["items"] == 10


def test_user_float32_vectors_are_served_to_two_jobs(tmp_path, daemons):
    vectors = _vectors_class()(22, seed=SEED)
    st = _two_jobs_get_the_local_batches(tmp_path, daemons, "vectors:Vectors", {"items": 22}, vectors, 22)
    assert (st["sample_shape"], st["sample_dtype"]) == ([4], "float32")
    assert st["data"] == "vectors:Vectors(items=22)"  # its class and arguments, not <... object at 0x...>


def test_a_job_whose_samples_differ_is_refused_naming_both(daemons, audio_root):
    daemon = daemons(AUDIO, {"root": audio_root, "seconds": SECONDS}, "--workers", "1", "--join-window", "0")
    longer = coordl.AudioFolder(audio_root, seconds=1.0, seed=SEED)
    with pytest.raises(coordl.CoordinatorError, match=r"samples float32 \(1, 16000\) \(the job's dataset's "
                       r"sample_spec\(\)\) != the daemon's float32 \(1, 8000\) .*--dataset-args"):
        coordl.DataLoader(longer, batch_size=BATCH, shuffle=True, coordinator=daemon.address)
    val = coordl.AudioFolder(audio_root, seconds=SECONDS, seed=SEED, transform="val")  # same shape, centred
    with pytest.raises(coordl.CoordinatorError, match=r"transform=.*transform='val'.*\(job\) != the daemon's "
                       r".*transform='train'.*--dataset-args giving transform='train'"):
        coordl.DataLoader(val, batch_size=BATCH, shuffle=True, coordinator=daemon.address)
    same = coordl.DataLoader(coordl.AudioFolder(audio_root, seconds=SECONDS, seed=SEED), batch_size=BATCH,
                             shuffle=True, coordinator=daemon.address)
    waves, labels = next(iter(same))
    assert (tuple(waves.shape), waves.dtype, labels.dtype) == ((BATCH, 1, 8000), torch.float32, torch.int64)
    assert waves.data_ptr() in [t.data_ptr() for t in same.coordinator._samples]  # a view of a ring slot
    same.coordinator.close()
    assert daemon.stop() == 0 and daemon.segments_left() == []


def test_a_sample_of_another_shape_fails_its_batch_naming_item_specs_and_fix(daemons):
    daemon = daemons("vectors:Vectors", {"items": 8, "bad_item": 5}, "--workers", "1", "--join-window", "0",
                     "--no-shuffle")
    job = coordl.DataLoader(_vectors_class()(8, bad_item=5, seed=SEED), batch_size=BATCH, shuffle=False,
                            coordinator=daemon.address)
    it = iter(job)
    first = next(it)  # items 0-3
    assert tuple(first[0].shape) == (BATCH, 4) and first.indices.tolist() == [0, 1, 2, 3]
    with pytest.raises(coordl.ConfigError) as err:
        next(it)
    text = str(err.value)
    assert "batch 1 of epoch 0 could not be prepared by the coordinator: ConfigError: coordl serve " \
           "--dataset vectors:Vectors: prep(5) returned float32 (5,), and the daemon's ring holds " \
           "float32 (4,) per sample" in text
    assert "override Vectors.sample_spec()" in text and "internal" not in text
    with pytest.raises(StopIteration):
        next(it)
    job.coordinator.close()
    assert daemon.stop() == 0 and daemon.segments_left() == []
