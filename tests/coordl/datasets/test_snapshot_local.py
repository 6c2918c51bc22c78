"""A loader serves one snapshot of local data: a WebDataset shard or an ImageFolder file rewritten
between two epochs is a SampleError saying it changed (or a counted skip), never the new bytes with
the old index, labels or listing; the same at 0 and 2 workers; with a MinIO cache the listed bytes."""

from __future__ import annotations

import gc
import os
import shutil
import sys

import pytest

import coordl
from coordl.errors import SampleError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_webdataset import write_shards  # noqa: E402


def _run(loader) -> list:
    return [(x.clone(), y.clone()) for x, y in loader]


def _replace_with_new_labels(tiny_root: str, tmp_path, paths: list[str]) -> None:
    """Shard 1 rewritten (a new file over it) with its members in another order and new .cls labels."""
    other = str(tmp_path / "other")
    shutil.copytree(tiny_root, other)
    names = sorted(os.listdir(other))
    os.rename(os.path.join(other, names[0]), os.path.join(other, "zz_moved"))
    _, new = write_shards(other, str(tmp_path / "new"))
    os.replace(new[1], paths[1])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_rewritten_between_epochs_is_a_sample_error(tiny_root, tmp_path, workers):
    pattern, paths = write_shards(tiny_root, str(tmp_path / "shards"))
    ds = coordl.WebDataset(pattern, transform="val", size=16, index_cache="off")
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=workers)
    assert len(_run(loader)) == 5
    _replace_with_new_labels(tiny_root, tmp_path, paths)
    with pytest.raises(SampleError, match=rf"{paths[1]}: sample .*changed since it was indexed"):
        _run(loader)
    del loader
    gc.collect()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_rewritten_in_place_is_a_counted_skip(tiny_root, tmp_path, workers):
    pattern, paths = write_shards(tiny_root, str(tmp_path / "shards"))
    ds = coordl.WebDataset(pattern, transform="val", size=16, index_cache="off", on_error="skip")
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=workers)
    first = _run(loader)
    with open(paths[2], "r+b") as f:  # same inode, new bytes
        f.seek(1024)
        f.write(b"\xff" * 16)
    second = _run(loader)
    assert loader.stats()["errors_skipped"] == 8  # shard 2's 8 samples
    assert sum(len(y) for _, y in second) == sum(len(y) for _, y in first) - 8


@pytest.mark.parametrize("workers", [0, 2])
def test_an_imagefolder_file_rewritten_between_epochs_is_a_sample_error(tiny_root, tmp_path, workers):
    root = str(tmp_path / "train")
    shutil.copytree(tiny_root, root)
    ds = coordl.ImageFolder(root, transform="val", size=16, manifest_cache="off")
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=workers)
    _run(loader)
    victim = ds.manifest.path(3)
    with open(ds.manifest.path(4), "rb") as f:
        other = f.read()
    with open(victim, "wb") as f:
        f.write(other)
    with pytest.raises(SampleError, match=rf"{victim}: changed since the dataset was listed"):
        _run(loader)
    del loader
    gc.collect()


def test_with_a_minio_cache_the_listed_shard_bytes_are_served(tiny_root, tmp_path, dropped):
    pattern, paths = write_shards(tiny_root, str(tmp_path / "shards"))
    ds = coordl.WebDataset(pattern, transform="val", size=16, index_cache="off")
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=2, cache=8 << 20)
    dropped.append(loader.dataset)
    first = _run(loader)
    _replace_with_new_labels(tiny_root, tmp_path, paths)
    second = _run(loader)
    assert all((a == b).all() and (y == v).all() for (a, y), (b, v) in zip(first, second))
