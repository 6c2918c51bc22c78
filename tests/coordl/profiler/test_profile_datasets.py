"""coordl.profile on datasets other than an ImageFolder of JPEGs: an AudioFolder, a WebDataset of
local tar shards, and a user's coordl.CoordlDataset subclass whose samples are dicts, each with
real loader workers (num_workers=2) and real MinIO segments.

Counts, not timings: the items, batches and storage reads each run reports, the train step's
batches (synthetic and loaded) are the dataset's own (shapes, dtypes, structure), what the report
says about the page cache, and nothing left in the shared-memory folder (also the autouse no_leaks).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pytest
import torch

import coordl
from coordl.cache import shm
from coordl.manifest.build import scan
from coordl.profiler import TrainStepError, measure, profile

BATCH, STEPS, WORKERS = 4, 2, 2
NEED = (2 + STEPS) * BATCH  # items a loader run uses: 2 warm-up steps, then STEPS timed


def recording_step(seen: list):
    """A train step that records each batch's description and returns a loss from its floats."""
    def step(batch):
        seen.append(measure.describe(batch))
        x = batch["x"] if isinstance(batch, dict) else batch[0]
        return x.float().mean()
    return step


def check_report(r, items: int, dataset_bytes: int, kind: str, cold: bool) -> dict:
    """The fields every profile has, sane, and the per-run counts every dataset must give."""
    d = json.loads(r.to_json())
    assert d["settings"]["items"] == items and d["settings"]["dataset_bytes"] == dataset_bytes
    assert d["measured"]["storage"]["kind"] == kind and d["measured"]["storage"]["cold"] is cold
    assert min(d["rates"].values()) > 0
    for key in ("fetch_stall_pct", "prep_stall_pct", "compute_pct"):
        assert 0 <= d[key] <= 100
    assert d["fetch_stall_pct"] + d["prep_stall_pct"] + d["compute_pct"] == pytest.approx(100.0)
    assert all(d["epoch"][k] >= 0 for k in ("compute_s", "prep_stall_s", "fetch_stall_s", "total_s"))
    m = d["measured"]
    assert m["ingestion"]["samples"] == STEPS * BATCH and m["ingestion"]["batches"] == STEPS
    runs = m["prep_alone_by_workers"] + m["prep_cold_by_workers"] + m["train_cached_by_workers"]
    assert [run["workers"] for run in m["prep_cold_by_workers"]] == list(range(1, WORKERS + 1))
    for run in runs + [m["profiled"]]:
        assert run["samples"] == STEPS * BATCH and run["batches"] == STEPS
        assert run["decodes"] == NEED  # every item of the run prepared once (the rest after the timed steps)
        assert 0 <= run["cpu_s_per_sample_workers"] < 1 and 0 < run["cores_busy"] <= len(os.sched_getaffinity(0))
    for run in m["prep_alone_by_workers"] + m["train_cached_by_workers"]:
        assert run["storage_reads"] == 0 and run["storage_bytes"] == 0 and run["cache_hits"] == NEED
    for run in m["prep_cold_by_workers"] + [m["profiled"]]:  # no cache: every item from storage
        assert run["cache_hits"] == 0 and run["storage_bytes"] > 0
    assert m["profiled"]["cache_fraction"] == 0.0
    assert len(m["storage_bw_by_readers"]) == WORKERS and min(m["storage_bw_by_readers"]) > 0
    assert m["memory_bw"] > 0 and m["inputs"]["read_latency"] > 0
    assert all(0 <= row["cache_fraction"] <= 1 for row in d["what_if"]["by_cache"])
    assert 0 <= d["what_if"]["smallest_cache"]["fetch_stall"] <= 1
    for v in d["validation"]:
        assert 0 <= v["config"]["cache_fraction"] <= 1 and v["measured"] > 0
    assert d["verdict"]["stall"] in ("fetch", "prep", "none")
    assert "fetch stall" in r.table() and kind in r.table()
    assert not [n for n in os.listdir(shm.SHM_DIR) if "profile" in n]  # its private caches are dropped
    return d


# -- an AudioFolder ------------------------------------------------------------------------------------

AUDIO_FILES, RATE = 24, 16000


@pytest.fixture
def audio_root(tmp_path) -> str:
    """24 mono WAVs of 0.5 s in 2 classes (a few shorter, zero-padded by the window)."""
    sf = pytest.importorskip("soundfile")
    root = tmp_path / "audio"
    for k in range(AUDIO_FILES):
        (root / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        frames = RATE // 2 if k % 5 else RATE // 8
        data = np.random.default_rng(k).uniform(-0.5, 0.5, (frames, 1)).astype(np.float32)
        sf.write(str(root / f"c{k % 2}" / f"{k:02d}.wav"), data, RATE, subtype="FLOAT")
    return str(root)


def test_profile_an_audio_folder(audio_root):
    ds = coordl.AudioFolder(audio_root, sample_rate=RATE, seconds=0.25, channels=1)
    seen: list = []
    r = profile(recording_step(seen), ds, batch_size=BATCH, num_workers=WORKERS, steps=STEPS,
                validate=True, progress=False)
    d = check_report(r, AUDIO_FILES, int(ds.manifest.sizes.sum()), "files", True)
    for run in d["measured"]["prep_cold_by_workers"] + [d["measured"]["profiled"]]:
        assert run["storage_reads"] == NEED  # one read per file
    assert r.notes == [n for n in r.notes if "page cache" not in n]  # nothing said about the page cache
    # every batch the step saw, the ingestion's synthetic ones included, is the loader's: waveforms
    # float32 (B, 1, 4000) and int64 labels, never a (B, 3, H, W) image
    assert seen and set(seen) == {"[float32 (4, 1, 4000), int64 (4,)]"}
    assert ds.cache is None and ds.drop_page_cache is False  # the user's object untouched


def test_a_failing_step_names_the_audio_batch(audio_root):
    ds = coordl.AudioFolder(audio_root, sample_rate=RATE, seconds=0.25, channels=1)

    def wants_images(batch):
        return batch[0][:, :3, ::4, ::4].float().mean()  # an image model on audio
    with pytest.raises(TrainStepError, match=r"on a batch \[float32 \(4, 1, 4000\), int64 \(4,\)\]"):
        profile(wants_images, ds, batch_size=BATCH, num_workers=1, steps=1, progress=False)


# -- a WebDataset of local shards --------------------------------------------------------------------

PER_SHARD = 16


@pytest.fixture
def shards(tiny_root, tmp_path) -> str:
    """tiny_root's 40 JPEGs tarred in manifest order into 3 shards (16, 16, 8): key.jpg + key.cls."""
    m = scan(tiny_root, manifest_cache="off")
    out = tmp_path / "shards"
    out.mkdir()
    count = (len(m) + PER_SHARD - 1) // PER_SHARD
    for s in range(count):
        with tarfile.open(out / f"train-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * PER_SHARD, min(len(m), (s + 1) * PER_SHARD)):
                key = os.path.splitext(os.path.relpath(m.path(i), m.root))[0]
                with open(m.path(i), "rb") as f:
                    members = [(key + ".jpg", f.read()), (key + ".cls", str(int(m.labels[i])).encode())]
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(out / f"train-{{000000..{count - 1:06d}}}.tar")


def test_profile_a_webdataset_of_local_shards(shards):
    # max_gap=0: no two items of a batch are read by one pread (a .cls member lies between
    # neighbours), so a run's storage reads are its items, exactly
    ds = coordl.WebDataset(shards, size=32, max_gap=0)
    seen: list = []
    r = profile(recording_step(seen), ds, batch_size=BATCH, num_workers=WORKERS, steps=STEPS,
                validate=True, progress=False)
    d = check_report(r, 40, ds.index.total_bytes, "tar shards", True)
    for run in d["measured"]["prep_cold_by_workers"] + [d["measured"]["profiled"]]:
        assert run["storage_reads"] == NEED
    assert d["settings"]["dataset"] == shards
    assert set(seen) == {"[uint8 (4, 3, 32, 32), int64 (4,)]"}


def test_a_webdataset_coalesces_neighbours_in_the_profile(shards):
    ds = coordl.WebDataset(shards, size=32)  # the default max_gap: a batch's neighbours are one pread
    r = profile(recording_step([]), ds, batch_size=BATCH, num_workers=WORKERS, steps=STEPS, progress=False)
    d = check_report(r, 40, ds.index.total_bytes, "tar shards", True)
    for run in d["measured"]["prep_cold_by_workers"] + [d["measured"]["profiled"]]:
        assert 2 + STEPS <= run["storage_reads"] <= NEED  # at least one pread per batch, at most one per item


# -- a user's CoordlDataset ----------------------------------------------------------------------------

class Vectors(coordl.CoordlDataset):
    """A user's dataset: float32 vectors of 8, item i at offsets[i] of one blob file, read with a
    pread (it ignores drop_page_cache); a sample is a dict {"x": noisy vector, "y": class}."""

    def __init__(self, blob: str, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self.blob = blob
        n = os.path.getsize(blob) // 32
        self.offsets = [32 * i for i in range(n)]
        with open(blob, "rb") as f:
            self._fingerprint = hashlib.sha256(f.read()).hexdigest()[:32]

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def read(self, i: int) -> bytes:
        fd = os.open(self.blob, os.O_RDONLY)
        try:
            return os.pread(fd, 32, self.offsets[i])
        finally:
            os.close(fd)

    def prep(self, raw, i: int, epoch: int):
        x = np.frombuffer(bytes(raw), dtype=np.float32) + self.np_rng(i, epoch).normal(0, 0.01, 8).astype(np.float32)
        return {"x": torch.from_numpy(x), "y": i % 3}


@pytest.fixture
def vectors(tmp_path) -> Vectors:
    blob = tmp_path / "vectors.bin"
    blob.write_bytes(np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32).tobytes())
    return Vectors(str(blob))


def test_profile_a_users_dataset(vectors):
    seen: list = []
    r = profile(recording_step(seen), vectors, batch_size=BATCH, num_workers=WORKERS, steps=STEPS,
                validate=True, progress=False)
    d = check_report(r, 40, 40 * 32, "dataset read", False)
    for run in d["measured"]["prep_cold_by_workers"] + [d["measured"]["profiled"]]:
        assert run["storage_reads"] == NEED and run["storage_bytes"] == NEED * 32
    assert d["settings"]["dataset"] == "Vectors"
    # batches are dicts as torch collates the samples, the synthetic ones too
    assert set(seen) == {"{'x': float32 (4, 8), 'y': int64 (4,)}"}
    # it cannot drop the page cache: said in the report, not a crash
    note = d["measured"]["storage"]["note"]
    assert "Vectors" in note and "cannot drop its items from the page cache" in note and note in r.notes
    text = " ".join(r.table().split())  # the notes are wrapped
    assert "could not be dropped" in text and "cannot drop its items from the page cache" in text
    assert vectors.cache is None and vectors.drop_page_cache is False


# -- the synthetic batches alone -----------------------------------------------------------------------

def test_synthetic_batches_copy_the_loaders_batch():
    images = torch.arange(4 * 3 * 2 * 2, dtype=torch.uint8).reshape(4, 3, 2, 2).contiguous(
        memory_format=torch.channels_last)
    labels = torch.tensor([0, 1, 2, 3])
    for example in ([images, labels], {"x": images, "y": labels, "name": "a"}, (images, labels)):
        a, b = measure.synthetic_batches(example, seed=1)
        for batch in (a, b):
            assert type(batch) is type(example) and measure.describe(batch) == measure.describe(example)
            x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
            assert x.is_contiguous(memory_format=torch.channels_last) and x.data_ptr() != images.data_ptr()
            assert sorted(y.tolist()) == [0, 1, 2, 3]  # real labels, reordered
            assert all(torch.equal(x[k], images[int(y[k])]) for k in range(4))  # rows stay with their labels
    assert measure.rows({"x": torch.zeros(5, 2)}) == 5 and measure.rows([1, 2]) is None
