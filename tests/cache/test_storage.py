"""cache.storage.read_file returns exactly the file's bytes, whatever its size."""

import os

import pytest

from coordl.cache import storage


@pytest.mark.parametrize("size", [0, 1, 4095, 100_000, 3 << 20])
def test_read_file_returns_every_byte(tmp_path, size):
    path = tmp_path / "f.bin"
    data = os.urandom(size)
    path.write_bytes(data)
    assert storage.read_file(str(path)) == data
    assert storage.read_file(str(path), drop_page_cache=True) == data


def test_read_file_of_a_file_that_is_not_regular_reads_to_its_end(tmp_path):
    # /proc files report st_size 0 but have content: the read goes on to the end
    got = storage.read_file("/proc/self/status")
    assert b"Name:" in got and got.endswith(b"\n")


def test_read_file_missing_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        storage.read_file(str(tmp_path / "nope.jpg"))
