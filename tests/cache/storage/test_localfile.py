"""cache.storage.read_file returns exactly the file's bytes, whatever its size."""

import os

import pytest

from coordl.cache.storage import localfile


@pytest.mark.parametrize("size", [0, 1, 4095, 100_000, 3 << 20])
def test_read_file_returns_every_byte(tmp_path, size):
    path = tmp_path / "f.bin"
    data = os.urandom(size)
    path.write_bytes(data)
    assert localfile.read_file(str(path)) == data
    assert localfile.read_file(str(path), drop_page_cache=True) == data


def test_read_file_of_a_file_that_is_not_regular_reads_to_its_end(tmp_path):
    # /proc files report st_size 0 but have content: the read goes on to the end
    got = localfile.read_file("/proc/self/status")
    assert b"Name:" in got and got.endswith(b"\n")


def test_read_file_missing_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        localfile.read_file(str(tmp_path / "nope.jpg"))


def _resident_pages(path: str) -> int:
    """Pages of `path` in the page cache (mincore(2) over a shared read-only mapping)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_evict_drops_a_file_written_moments_ago(tmp_path):
    """A file just written is dirty in the page cache; DONTNEED alone keeps dirty pages (a bench's
    first epoch then read a dataset made moments before from memory): evict writes it back first."""
    path = str(tmp_path / "fresh.bin")
    mounts = [line.split()[1:3] for line in open("/proc/mounts")]
    fstype = max((m for m in mounts if path.startswith(m[0].rstrip("/") + "/")), key=lambda m: len(m[0]))[1]
    if fstype in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {fstype}: its pages are the file, never evicted")
    with open(path, "wb") as f:
        f.write(os.urandom(4 * 2**20))
    assert _resident_pages(path) > 0
    localfile.evict([path])
    assert _resident_pages(path) == 0
