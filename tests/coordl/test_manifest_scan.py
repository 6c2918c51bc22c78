"""coordl/manifest_scan.py: the statx rows equal what os.stat gives, file by file."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from coordl import manifest_scan


def _tree(tmp_path) -> tuple[int, list[str]]:
    d = tmp_path / "cls"
    d.mkdir()
    for i in range(50):
        (d / f"img_{i:03d}.jpg").write_bytes(b"x" * (i * 37))
    (d / "caf\u00e9.jpg").write_bytes(b"non-ascii name")
    (d / "bad-\udcff.jpg".encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")).write_bytes(b"y")
    os.symlink("img_007.jpg", d / "link.jpg")
    os.utime(d / "img_003.jpg", ns=(5, -1_500_000_001))  # before 1970, with nanoseconds
    return os.open(d, os.O_RDONLY | os.O_DIRECTORY), sorted(os.listdir(d))


@pytest.mark.skipif(sys.platform != "linux", reason="statx is Linux's")
def test_statx_columns_equal_os_stat(tmp_path):
    assert manifest_scan._STATX is not None
    fd, names = _tree(tmp_path)
    try:
        got = manifest_scan._stat_columns(fd, names)
        want = manifest_scan._columns(manifest_scan._stat_all(fd, names))
    finally:
        os.close(fd)
    for g, w in zip(got, want):
        assert g.dtype == np.int64 and np.array_equal(g, w)
    assert int(got[0][names.index("link.jpg")]) == 7 * 37 and int(got[1][names.index("img_003.jpg")]) == -1_500_000_001


def test_a_broken_link_falls_back_to_os_stat_and_is_marked(tmp_path):
    fd, names = _tree(tmp_path)
    os.symlink("missing.jpg", tmp_path / "cls" / "broken.jpg")
    names = sorted(names + ["broken.jpg"])
    try:
        sizes, mtimes, ctimes, inodes = manifest_scan._stat_columns(fd, names)
    finally:
        os.close(fd)
    k = names.index("broken.jpg")
    assert (int(sizes[k]), int(mtimes[k]), int(ctimes[k]), int(inodes[k])) == (-1, 0, 0, 0)
    assert int((sizes >= 0).sum()) == len(names) - 1
