"""DataLoader(backend="dali") skips and names exactly the files the CPU backend does (issue 24).

A folder mixing good JPEGs with the three broken JPEGs DALI used to decode
into pictures and files of other formats named .jpg (tests/pipelines/jpeg_faults.py):
the same rows, labels and skip counts batch by batch on both backends, for
random crops over two epochs and for val; with on_error="raise" the same
first file fails on both, its error naming the file and the format.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

import coordl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "pipelines"))
import jpeg_faults  # noqa: E402

pytest.importorskip("nvidia.dali")


@pytest.fixture
def mixed_root(tiny_root, tmp_path):
    root = str(tmp_path / "mixed")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    jpeg_faults.add_faults(root)
    return root


def _rows_and_skips(loader) -> tuple[list[tuple[int, list[int]]], int]:
    """(per batch: rows and labels, errors skipped) of one epoch."""
    before = loader.stats()["errors_skipped"]
    got = [(images.shape[0], labels.tolist()) for images, labels in loader]
    return got, loader.stats()["errors_skipped"] - before


@pytest.mark.parametrize("transform,epochs", [("train", 2), ("val", 1)])
def test_a_mixed_folder_gives_the_same_rows_and_skips_on_both_backends(mixed_root, transform, epochs):
    ds = coordl.ImageFolder(mixed_root, transform=transform, size=32, seed=3, on_error="skip")
    cpu = coordl.DataLoader(ds, batch_size=8, shuffle=True)
    dali = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, backend="dali")
    for epoch in range(epochs):
        want, want_skipped = _rows_and_skips(cpu)
        got, got_skipped = _rows_and_skips(dali)
        rows = sum(n for n, _ in got)
        print(f"{transform} epoch {epoch}: CPU {sum(n for n, _ in want)} rows, {want_skipped} skipped; "
              f"DALI {rows} rows, {got_skipped} skipped")
        assert got == want and got_skipped == want_skipped
        assert got_skipped >= 4 and rows + got_skipped == len(ds)  # RST, header only, PNG cut, random


@pytest.mark.parametrize("fault,fmt", [("PNG cut short", "PNG"), ("random bytes", "not an image format")])
def test_a_file_of_another_format_named_jpg_fails_naming_the_file_and_format(tiny_root, tmp_path, fault, fmt):
    root = str(tmp_path / "one")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    folder = os.path.join(root, sorted(os.listdir(root))[0])
    with open(os.path.join(folder, sorted(os.listdir(folder))[0]), "rb") as f:
        bad = os.path.join(folder, "0bad.jpg")
        with open(bad, "wb") as out:
            out.write(jpeg_faults.OTHER_FORMATS[fault](f.read()))
    ds = coordl.ImageFolder(root, transform="val", size=32)
    for backend in ("cpu", "dali"):
        with pytest.raises(coordl.SampleError) as caught:
            list(coordl.DataLoader(ds, batch_size=8, backend=backend))
        message = str(caught.value)
        assert message.startswith(bad) and fmt in message and "on_error='skip'" in message, (backend, message)
