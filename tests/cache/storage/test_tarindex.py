"""cache/storage/tarindex.py: the (shard, offset, size, label) index of WebDataset tar shards, persisted,
and reads by pread (a batch's neighbours in one shard coalesced into one read)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from coordl.cache import indexfile
from coordl.cache.storage import tarindex
from coordl.errors import SampleError


def _tar(path, members):
    """A tar of (name, bytes) members, in order."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def _img(k: int, n: int = 3000) -> bytes:
    return bytes([k % 251]) * n + f"image {k}".encode()


@pytest.fixture
def shards(tmp_path):
    a = _tar(tmp_path / "a.tar", [m for k in range(5) for m in
                                  ((f"d/{k:03d}.jpg", _img(k)), (f"d/{k:03d}.cls", str(k % 3).encode()))])
    b = _tar(tmp_path / "b.tar", [m for k in range(5, 8) for m in
                                  ((f"{k:03d}.cls", b"1\n"), (f"{k:03d}.JPG", _img(k)))])
    return [a, b]


def test_samples_grouped_by_key_in_shard_order_with_labels_and_exact_bytes(shards):
    index = tarindex.build_index(shards)
    assert len(index) == 8
    assert [index.key(i) for i in range(8)] == [f"d/{k:03d}" for k in range(5)] + ["005", "006", "007"]
    assert index.shard.tolist() == [0] * 5 + [1] * 3
    assert index.label.tolist() == [0, 1, 2, 0, 1, 1, 1, 1]  # "1\n" parses; upper-case JPG matches jpg
    assert (index.label_state == tarindex.OK).all() and (index.image_state == tarindex.OK).all()
    for i in range(8):
        assert index.read(i) == _img(i)
    assert index.total_bytes == sum(len(_img(k)) for k in range(8))
    assert index.damage == [None, None]
    index.close()


def test_extension_preference_missing_members_and_bad_labels(tmp_path):
    path = _tar(tmp_path / "s.tar", [
        ("x.png", b"png"), ("x.jpg", b"jpg"), ("x.cls", b"4"),   # jpg preferred over png
        ("nolabel.jpg", b"j"),                                    # no .cls
        ("noimage.cls", b"2"),                                    # no image
        ("bad.jpg", b"j"), ("bad.cls", b"cat"),                   # a label that is not an int
        ("README", b"no dot: ignored, as webdataset does"),
    ])
    index = tarindex.build_index([path])
    assert [index.key(i) for i in range(len(index))] == ["x", "nolabel", "noimage", "bad"]
    assert index.read(0) == b"jpg" and index.label[0] == 4
    assert index.label_state.tolist() == [tarindex.OK, tarindex.MISSING, tarindex.OK, tarindex.BAD]
    assert index.image_state.tolist() == [tarindex.OK, tarindex.OK, tarindex.MISSING, tarindex.OK]
    with pytest.raises(SampleError, match=r"s\.tar: sample 'noimage' has no image member"):
        index.read(2)
    png_first = tarindex.build_index([path], image_ext=("png", "jpg"))
    assert png_first.read(0) == b"png"
    index.close()
    png_first.close()


def test_neighbours_of_one_shard_are_one_read(shards):
    index = tarindex.build_index(shards)
    data, errors, reads, nbytes = index.read_many([2, 0, 1])       # neighbours: one pread
    assert not errors and reads == 1 and [data[i] for i in (0, 1, 2)] == [_img(0), _img(1), _img(2)]
    assert nbytes == index.offset[2] + index.size[2] - index.offset[0]
    _, _, reads, nbytes = index.read_many([0, 4])                   # far apart: two
    assert reads == 2 and nbytes == index.size[0] + index.size[4]
    _, _, reads, _ = index.read_many([4, 5])                        # two shards: two
    assert reads == 2
    _, _, reads, _ = index.read_many([0, 1], max_gap=0)             # no gap allowed: two
    assert reads == 2
    index.close()


def test_the_index_is_persisted_and_reused_until_a_shard_changes(shards, tmp_path):
    folder = str(tmp_path / "idx")
    before = dict(tarindex.BUILDS)
    first = tarindex.build_index(shards, folder=folder)
    second = tarindex.build_index(shards, folder=folder)
    assert tarindex.BUILDS["builds"] - before["builds"] == 1 and tarindex.BUILDS["loads"] - before["loads"] == 1
    assert second.fingerprint == first.fingerprint and second.offset.tolist() == first.offset.tolist()
    assert second.read(3) == _img(3)
    # a rewritten shard (same size, other bytes) is indexed again, with another fingerprint
    _tar(shards[0], [m for k in range(5) for m in
                     ((f"d/{k:03d}.jpg", _img(k + 100)), (f"d/{k:03d}.cls", str(k % 3).encode()))])
    third = tarindex.build_index(shards, folder=folder)
    assert tarindex.BUILDS["builds"] - before["builds"] == 2
    assert third.fingerprint != first.fingerprint and third.read(0) == _img(100)
    # a damaged file is not loaded: rebuilt
    (path,) = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".tarindex")]
    header, _ = indexfile.load_header(path, tarindex.MAGIC)
    assert header is not None
    with open(path, "r+b") as f:
        f.seek(header["body"])                     # the first bytes of the first array
        f.write(b"\xff\xff\xff")
    tarindex.build_index(shards, folder=folder)
    assert tarindex.BUILDS["builds"] - before["builds"] == 3
    # a file of the old format (magic COORDLT1) is rebuilt once, then loaded
    with open(path, "r+b") as f:
        f.write(b"COORDLT1")
    tarindex.build_index(shards, folder=folder).close()
    tarindex.build_index(shards, folder=folder).close()
    assert tarindex.BUILDS["builds"] - before["builds"] == 4
    for ix in (first, second, third):
        ix.close()


def test_damaged_shards_keep_their_readable_samples_and_say_where(tmp_path):
    members = [m for k in range(4) for m in ((f"{k}.jpg", _img(k)), (f"{k}.cls", b"0"))]
    whole = _tar(tmp_path / "whole.tar", members)
    raw = open(whole, "rb").read()
    truncated = tmp_path / "truncated.tar"        # ends inside the last image member
    index = tarindex.build_index([whole])
    cut = int(index.offset[3]) + 100
    truncated.write_bytes(raw[:cut])
    garbage = tmp_path / "garbage.tar"            # a member header overwritten after sample 1
    third_header = int(index.offset[2]) - 512
    garbage.write_bytes(raw[:third_header] + b"\x07" * 512 + raw[third_header + 512:])
    not_tar = tmp_path / "not.tar"
    not_tar.write_bytes(b"this is not a tar file" * 100)
    index.close()

    index = tarindex.build_index([str(truncated), str(garbage), str(not_tar)])
    assert index.damage[0] and "'3'" in index.damage[0]
    assert index.damage[1] and "'1'" in index.damage[1]
    assert index.damage[2] and "not a readable tar" in index.damage[2]
    assert [index.key(i) for i in range(len(index))] == ["0", "1", "2", "3", "0", "1"]
    assert index.read(0) == _img(0) and index.read(5) == _img(1)
    with pytest.raises(SampleError, match=r"truncated\.tar: sample '3': the shard ends inside the image"):
        index.read(3)
    index.close()


def _rchar() -> int:
    """Bytes this process has read through read(2)-like calls (/proc/self/io, every thread)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_indexing_reads_headers_not_member_data(tmp_path):
    """A shard whose image members are 64 MiB holes each: indexing it reads a few KiB."""
    path = tmp_path / "big.tar"
    big = 64 * 2**20
    with open(path, "wb") as f:
        for k in range(4):
            info = tarfile.TarInfo(f"{k}.jpg")
            info.size = big
            f.write(info.tobuf(format=tarfile.USTAR_FORMAT))
            f.seek(big, os.SEEK_CUR)                      # the member's data: a hole, never written
            label = tarfile.TarInfo(f"{k}.cls")
            label.size = 1
            f.write(label.tobuf(format=tarfile.USTAR_FORMAT) + str(k).encode() + b"\0" * 511)
        f.write(b"\0" * 1024)
    before = _rchar()
    index = tarindex.build_index([str(path)])
    assert _rchar() - before < 256 * 1024                 # of 256 MiB of members
    assert len(index) == 4 and index.size.tolist() == [big] * 4 and index.label.tolist() == [0, 1, 2, 3]
    assert index.damage == [None]
    index.close()
