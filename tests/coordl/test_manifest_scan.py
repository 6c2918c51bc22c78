"""coordl/manifest/walk.py: the C extension's and statx's columns equal what os.stat gives, file by file."""

from __future__ import annotations

import os

import numpy as np
import pytest

from coordl.manifest import walk as manifest_scan


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


def _want(fd, names):
    return manifest_scan._columns(manifest_scan._stat_all(fd, names))


def test_the_c_extension_was_built_and_is_used(tmp_path):
    # install.sh builds it (setup.py); a scan without it is 3-5x slower per file at 1.28M files
    assert manifest_scan._statnames is not None, "coordl.manifest._statnames was not built: run bash install.sh"
    fd, names = _tree(tmp_path)
    try:
        got = manifest_scan._stat_columns(fd, names)
        want = manifest_scan._c_columns(fd, names)
    finally:
        os.close(fd)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("how", ["c", "statx"])
def test_columns_equal_os_stat(tmp_path, how):
    if how == "statx" and manifest_scan._STATX is None:
        pytest.skip("statx is Linux's (glibc >= 2.28)")
    fd, names = _tree(tmp_path)
    try:
        got = (manifest_scan._c_columns if how == "c" else manifest_scan._statx_columns)(fd, names)
        want = _want(fd, names)
    finally:
        os.close(fd)
    for g, w in zip(got, want):
        assert g.dtype == np.int64 and np.array_equal(g, w)
    assert int(got[0][names.index("link.jpg")]) == 7 * 37 and int(got[1][names.index("img_003.jpg")]) == -1_500_000_001


@pytest.mark.parametrize("how", ["c", "statx", "os.stat"])
def test_a_broken_link_is_marked_and_the_rest_stated(tmp_path, monkeypatch, how):
    if how != "c":
        monkeypatch.setattr(manifest_scan, "_statnames", None)
    if how == "os.stat":
        monkeypatch.setattr(manifest_scan, "_STATX", None)
    fd, names = _tree(tmp_path)
    os.symlink("missing.jpg", tmp_path / "cls" / "broken.jpg")
    names = sorted(names + ["broken.jpg"])
    try:
        got = manifest_scan._stat_columns(fd, names)
        want = _want(fd, names)
    finally:
        os.close(fd)
    sizes, mtimes, ctimes, inodes = got
    k = names.index("broken.jpg")
    assert (int(sizes[k]), int(mtimes[k]), int(ctimes[k]), int(inodes[k])) == (-1, 0, 0, 0)
    assert int((sizes >= 0).sum()) == len(names) - 1
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_the_c_extension_rejects_names_that_do_not_match_the_count(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        out = np.empty((4, 2), dtype=np.int64)
        with pytest.raises(ValueError, match="NUL-ended names"):
            manifest_scan._statnames.stat_names(fd, b"a\0b", 2, out)
        with pytest.raises(ValueError, match="out holds"):
            manifest_scan._statnames.stat_names(fd, b"a\0b\0c\0", 3, out)
    finally:
        os.close(fd)
