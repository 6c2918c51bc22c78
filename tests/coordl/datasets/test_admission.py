"""coordl/datasets/admission.py: an item enters the MinIO cache only once its prep succeeded, so a
file that does not decode (skipped with on_error="skip") never takes cache space and is read, and
skipped, from storage alone each epoch. Exact counts: cache bytes and items, storage reads per epoch."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys

import numpy as np
import pytest
import torch

import coordl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coordl_tests_loaderhelp import epoch_counts
from test_webdataset import write_shards  # noqa: E402

BROKEN = 300_000  # bytes of the file that does not decode (the was 150 MB)


def _broken(path: str) -> None:
    """Bytes that are no image (nor audio), seeded."""
    with open(path, "wb") as f:
        f.write(b"NOTANIMAGE" + np.random.default_rng(5).bytes(BROKEN - 10))


def _check_two_epochs(loader, n: int, total: int) -> None:
    """Epoch 1 reads everything and caches all but the broken item; epoch 2 reads only it."""
    first = epoch_counts(loader)
    assert first["storage_reads"] == n and first["storage_bytes"] == total
    assert first["errors_skipped"] == 1 and first["samples"] == n - 1
    assert first["cache_inserts"] == n - 1
    stats = loader.stats()
    assert stats["cache_items"] == n - 1 and stats["cache_bytes"] == total - BROKEN
    second = epoch_counts(loader)
    assert second["storage_reads"] == 1 and second["storage_bytes"] == BROKEN
    assert second["cache_hits"] == n - 1 and second["cache_misses"] == 1 and second["cache_inserts"] == 0
    assert second["errors_skipped"] == 1 and second["samples"] == n - 1
    assert loader.stats()["cache_bytes"] == total - BROKEN


@pytest.mark.parametrize("workers", [0, 2])
def test_a_broken_jpeg_skipped_is_not_cached(tiny_root, tmp_path, dropped, workers):
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    cls = sorted(os.listdir(root))[0]
    _broken(os.path.join(root, cls, "broken.jpg"))
    ds = coordl.ImageFolder(root, transform="val", size=32, on_error="skip")
    dropped.append(ds)
    n, total = len(ds), ds.manifest.total_bytes
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers, cache=total)
    dropped.append(loader.dataset)
    _check_two_epochs(loader, n, total)


class Blobs(coordl.CoordlDataset):
    """A user's dataset (the contract only): files of a folder, whose prep refuses 'NOTANIMAGE'."""

    def __init__(self, root: str) -> None:
        super().__init__(on_error="skip")
        self.root = root
        self.paths = sorted(os.path.join(root, f) for f in os.listdir(root))
        self.sizes = [os.path.getsize(p) for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(repr(list(zip(self.paths, self.sizes))).encode()).hexdigest()

    @property
    def manifest(self):  # what the loader caps the cache's capacity by
        return type("M", (), {"total_bytes": sum(self.sizes)})()

    def read(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as f:
            return f.read()

    def prep(self, raw, i: int, epoch: int | None = None):
        if bytes(raw[:10]) == b"NOTANIMAGE":
            raise coordl.SampleError(f"{self.paths[i]}: not a blob")
        return torch.tensor(len(raw)), 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_user_datasets_item_whose_prep_raised_is_not_cached(tmp_path, dropped, workers):
    root = tmp_path / "blobs"
    root.mkdir()
    for k in range(12):
        (root / f"{k:02d}.bin").write_bytes(bytes([k]) * (1000 + k))
    _broken(str(root / "05-broken.bin"))
    ds = Blobs(str(root))
    dropped.append(ds)
    n, total = len(ds), sum(ds.sizes)
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=workers, cache=total)
    dropped.append(loader.dataset)
    _check_two_epochs(loader, n, total)
    assert loader.dataset.cache.get(5) is None and bytes(loader.dataset.cache.get(4)) == bytes([4]) * 1004


def test_a_broken_webdataset_member_skipped_is_not_cached(tiny_root, tmp_path, dropped):
    pattern, _paths = write_shards(tiny_root, str(tmp_path / "shards"),
                                   replace={7: b"NOTANIMAGE" + np.random.default_rng(5).bytes(BROKEN - 10)})
    ds = coordl.WebDataset(pattern, transform="val", size=32, on_error="skip")
    dropped.append(ds)
    n, images = len(ds), int(ds.index.size.sum())
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=0, cache=images)
    dropped.append(loader.dataset)
    first = epoch_counts(loader)
    assert first["errors_skipped"] == 1 and first["cache_inserts"] == n - 1
    stats = loader.stats()
    assert stats["cache_items"] == n - 1 and stats["cache_bytes"] == images - BROKEN
    second = epoch_counts(loader)
    assert second["storage_reads"] == 1 and second["cache_hits"] == n - 1 and second["errors_skipped"] == 1


def test_a_cut_short_wav_skipped_is_not_cached(tmp_path, dropped):
    sf = pytest.importorskip("soundfile")
    root = tmp_path / "audio" / "noise"
    root.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for k in range(6):
        sf.write(str(root / f"{k}.wav"), rng.uniform(-0.5, 0.5, (8000, 1)).astype(np.float32), 16000,
                 subtype="PCM_16")
    sf.write(str(root / "cut.wav"), rng.uniform(-0.5, 0.5, (48000, 1)).astype(np.float32), 16000,
             subtype="PCM_16")
    os.truncate(root / "cut.wav", BROKEN // 10)
    ds = coordl.AudioFolder(str(tmp_path / "audio"), on_error="skip")
    dropped.append(ds)
    n, total = len(ds), ds.manifest.total_bytes
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=0, cache=total)
    dropped.append(loader.dataset)
    first = epoch_counts(loader)
    assert first["storage_reads"] == n and first["errors_skipped"] == 1 and first["cache_inserts"] == n - 1
    assert loader.stats()["cache_bytes"] == total - BROKEN // 10
    second = epoch_counts(loader)
    assert second["storage_reads"] == 1 and second["storage_bytes"] == BROKEN // 10
    assert second["cache_hits"] == n - 1 and second["errors_skipped"] == 1


def test_a_file_dali_cannot_decode_is_not_cached(tiny_root, tmp_path, dropped):
    """The DALI backend decodes after the batch's fetch returned (batches in flight): its reads
    wait for DALI's verdict before they enter the cache."""
    pytest.importorskip("nvidia.dali", reason="the DALI backend needs nvidia-dali (install.sh installs it)")
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    cls = sorted(os.listdir(root))[0]
    _broken(os.path.join(root, cls, "broken.jpg"))
    ds = coordl.ImageFolder(root, transform="val", size=32, on_error="skip")
    dropped.append(ds)
    n, total = len(ds), ds.manifest.total_bytes
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, cache=total, backend="dali")
    dropped.append(loader.dataset)
    _check_two_epochs(loader, n, total)
