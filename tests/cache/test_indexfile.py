"""cache/indexfile.py: the one atomic "magic + length + checksum" index file (tar index, manifests)."""

from __future__ import annotations

import os

import numpy as np

from coordl.cache import indexfile

MAGIC = b"COORDLX1"


def _arrays() -> dict[str, np.ndarray]:
    return {"a": np.arange(5, dtype=np.int64), "b": np.frombuffer(b"abc", np.uint8), "c": np.zeros(0, np.uint32)}


def test_saved_arrays_and_header_come_back(tmp_path):
    path = str(tmp_path / "x.index")
    indexfile.save(path, MAGIC, {"format": "x-1", "root": "/data"}, _arrays())
    header, why = indexfile.load_header(path, MAGIC, "x-1")
    assert why == "" and header is not None and header["root"] == "/data"
    assert header["total"] == os.path.getsize(path) and header["body"] % 8 == 0
    got = indexfile.read_arrays(path, header)
    assert got is not None and set(got) == {"a", "b", "c"}
    for name, want in _arrays().items():
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want)
    assert set(indexfile.read_arrays(path, header, ["b"]) or {}) == {"b"}
    assert os.listdir(tmp_path) == ["x.index"]  # written under a temporary name, then renamed


def test_missing_foreign_and_other_format_read_as_absent(tmp_path):
    path = str(tmp_path / "x.index")
    assert indexfile.load_header(path, MAGIC) == (None, "")
    indexfile.save(path, MAGIC, {"format": "x-1"}, _arrays())
    assert indexfile.load_header(path, b"COORDLX0") == (None, "")   # an older magic: rebuilt in silence
    assert indexfile.load_header(path, MAGIC, "x-2") == (None, "")  # another format
    assert indexfile.load_header(path, MAGIC, "x-1")[0] is not None


def test_damage_is_told_apart(tmp_path):
    path = str(tmp_path / "x.index")
    indexfile.save(path, MAGIC, {}, _arrays())
    header, _ = indexfile.load_header(path, MAGIC)
    assert header is not None
    raw = bytearray(open(path, "rb").read())
    raw[-9] ^= 0xFF                                                  # a byte of an array
    open(path, "wb").write(raw)
    assert indexfile.load_header(path, MAGIC)[0] is not None and indexfile.read_arrays(path, header) is None
    raw[30] ^= 0xFF                                                  # a byte of the header
    open(path, "wb").write(raw)
    assert indexfile.load_header(path, MAGIC) == (None, "its header fails its checksum")
    indexfile.save(path, MAGIC, {}, _arrays())
    with open(path, "ab") as f:
        f.write(b"\0" * 8)                                           # longer than recorded
    why = indexfile.load_header(path, MAGIC)[1]
    assert "bytes where its header records" in why
