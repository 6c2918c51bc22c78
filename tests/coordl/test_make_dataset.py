"""`coordl make-dataset` never mixes a new dataset into a folder's contents, and fails cleanly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coordl.cli.make_dataset import make_dataset
from coordl.errors import ConfigError

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([COORDL, "make-dataset", *args, "--size", "32x24", "--workers", "1"],
                          capture_output=True, text=True, timeout=120)


def _listing(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _contents(root) -> dict[str, bytes]:
    return {rel: open(os.path.join(root, rel), "rb").read() for rel in _listing(root)}


def test_a_non_empty_folder_is_refused_without_overwrite_and_left_as_it_was(tmp_path):
    root = str(tmp_path / "d")
    assert _run(root, "--images", "6", "--classes", "3").returncode == 0
    before = _contents(root)
    proc = _run(root, "--images", "4", "--classes", "2", "--seed", "9")
    assert proc.returncode == 2
    assert f"the folder {root!r} is not empty" in proc.stderr and "--overwrite" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _contents(root) == before


def test_overwrite_replaces_an_earlier_dataset_with_exactly_the_new_one(tmp_path):
    root, fresh = str(tmp_path / "d"), str(tmp_path / "fresh")
    assert _run(root, "--images", "6", "--classes", "3").returncode == 0
    proc = _run(root, "--images", "4", "--classes", "2", "--seed", "9", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert _run(fresh, "--images", "4", "--classes", "2", "--seed", "9").returncode == 0
    assert _contents(root) == _contents(fresh)     # no class_0002, no img_0000004/5 left over


def test_overwrite_never_deletes_what_make_dataset_did_not_write(tmp_path):
    root = tmp_path / "d"
    make_dataset(str(root), images=4, classes=2, size=(32, 24), workers=1, progress=False)
    (root / "class_0001" / "mine.png").write_bytes(b"x")
    (root / "notes.txt").write_text("keep")
    before = _contents(root)
    proc = _run(str(root), "--images", "4", "--classes", "2", "--overwrite")
    assert proc.returncode == 2 and "did not write" in proc.stderr and "Traceback" not in proc.stderr
    assert _contents(root) == before


def test_an_empty_folder_is_used(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    make_dataset(str(root), images=2, classes=2, size=(32, 24), workers=1, progress=False)
    assert _listing(root) == ["class_0000/img_0000000.jpg", "class_0001/img_0000001.jpg"]
    with pytest.raises(ConfigError, match="is not empty .*overwrite=True"):
        make_dataset(str(root), images=2, classes=2, size=(32, 24), workers=1, progress=False)


@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_an_unwritable_path_is_a_clean_error_naming_it(tmp_path, where):
    if where == "under_a_file":
        (tmp_path / "a_file").write_text("x")
        path = str(tmp_path / "a_file" / "data")
    else:
        path = "/proc/coordl-no-such-folder/data"        # a filesystem nobody can create folders in
    proc = _run(path, "--images", "2", "--classes", "1")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and repr(path) in proc.stderr, proc.stderr
    assert proc.stderr.startswith("coordl: error: make-dataset: cannot")
