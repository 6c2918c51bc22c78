"""Every kind of bad input: a clear error naming the file (raise) or a counted skip (skip)."""

import gc
import os
import shutil

import pytest
import torch

import coordl

BAD = ["corrupt.jpg", "truncated.jpg", "empty.jpg", "text.jpg", "vanished.jpg", "dangling.jpg"]


@pytest.fixture
def bad_root(tmp_path, tiny_root):
    """The tiny dataset plus one file of each bad kind in class_0002 (vanished after scanning)."""
    root = tmp_path / "bad"
    shutil.copytree(tiny_root, root)
    cls = root / "class_0002"
    good = (cls / sorted(os.listdir(cls))[0]).read_bytes()
    (cls / "corrupt.jpg").write_bytes(good[:200] + bytes(range(256)) * 20)
    (cls / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (cls / "empty.jpg").write_bytes(b"")
    (cls / "text.jpg").write_text("this is a text file, not a JPEG\n")
    (cls / "vanished.jpg").write_bytes(good)
    os.symlink(root / "nowhere.jpg", cls / "dangling.jpg")
    return root


def _dataset(root, **kw):
    ds = coordl.ImageFolder(root, transform="train", size=32, **kw)
    os.remove(os.path.join(root, "class_0002", "vanished.jpg"))  # disappears after the scan
    return ds


@pytest.mark.parametrize("name", BAD)
def test_raise_names_the_file_in_the_main_process(bad_root, name):
    ds = _dataset(bad_root)
    i = next(k for k, (p, _) in enumerate(ds.samples) if p.endswith(name))
    with pytest.raises(coordl.SampleError, match=name) as info:
        ds[i]
    assert "on_error='skip'" in str(info.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_raise_reaches_the_training_loop_from_a_worker(bad_root, workers):
    ds = _dataset(bad_root)
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=workers, timeout=60 if workers else 0)
    with pytest.raises(coordl.SampleError, match=r"class_0002/(corrupt|dangling|empty|text|truncated|vanished)"):
        for _ in loader:
            pass
    del loader  # the traceback held by pytest keeps the iterator (and its workers) alive until gc
    gc.collect()


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_drops_and_counts_and_the_epoch_completes(bad_root, workers):
    ds = _dataset(bad_root, on_error="skip")
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers)
    for _epoch in range(2):
        n = sum(len(y) for _, y in loader)
        assert n == len(ds) - len(BAD) == 40
    stats = loader.stats()
    assert stats["errors_skipped"] == 2 * len(BAD)
    assert stats["samples"] == 80


def test_skip_with_a_callable_transform(bad_root):
    ds = _dataset(bad_root, on_error="skip")
    ds.transform = lambda img: torch.zeros(1)
    loader = coordl.DataLoader(ds, batch_size=5, num_workers=2)
    assert sum(len(y) for _, y in loader) == 40
    assert loader.stats()["errors_skipped"] == len(BAD)


def test_empty_class_folder(tmp_path, tiny_root):
    root = tmp_path / "empty_class"
    shutil.copytree(tiny_root, root)
    (root / "class_9999").mkdir()
    with pytest.raises(coordl.DatasetError, match="class_9999.*holds no image.*on_error='skip'"):
        coordl.ImageFolder(root)
    ds = coordl.ImageFolder(root, on_error="skip")
    assert ds.classes[-1] == "class_9999" and len(ds) == 40


def test_missing_root(tmp_path):
    with pytest.raises(coordl.DatasetError, match="does not exist.*make-dataset"):
        coordl.ImageFolder(tmp_path / "nope")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"x")
    with pytest.raises(coordl.DatasetError, match="no class sub-folders"):
        coordl.ImageFolder(tmp_path / "flat")
