"""Reading item bytes from storage.

`drop_page_cache=True` tells the kernel, after the read, that the file's
pages are not needed again (`posix_fadvise(DONTNEED)`), so memory goes to the
MinIO cache instead of a second copy in the page cache that an LRU would
thrash anyway.

`expect=(size, mtime_ns)`, the file as the dataset listed it: the file opened must still have them
(one fstat, which the read makes anyway), else a SampleError says it changed: a loader serves the
dataset as listed when it was built, never a mix of old listing and new bytes.
"""

from __future__ import annotations

import os

from coordl.errors import SampleError


def read_file(path: str, drop_page_cache: bool = False, expect: tuple[int, int] | None = None) -> bytes:
    """The whole file at `path`. Raises OSError as open/read do.

    One read of the size `fstat` gives (plus one byte, to see the end): a
    fixed 1 MiB read buffer costs a fresh allocation and its page faults on
    every file, ~3x the time of the read itself for a 100 KiB JPEG. A file
    that grows meanwhile, or a short read, is read on to its end.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        size = st.st_size
        if expect is not None and (size, st.st_mtime_ns) != tuple(expect):
            raise SampleError(f"{path}: changed since the dataset was listed (size {size}, mtime_ns "
                              f"{st.st_mtime_ns}; listed: {expect[0]}, {expect[1]}): a loader serves the files as "
                              "listed when the dataset was built; build it again with rescan=True to read the "
                              "new contents, or pass on_error='skip'")
        data = os.read(fd, size + 1)
        if len(data) != size:
            chunks = [data]
            while chunk := os.read(fd, max(size, 1 << 16)):
                chunks.append(chunk)
            data = b"".join(chunks)
        if drop_page_cache:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return data


def evict(paths) -> None:
    """Drop the files' pages from the page cache (posix_fadvise DONTNEED; no root needed), so the
    next read of each comes from storage. Each file is written back first (fsync): DONTNEED drops
    clean pages only, and a file written moments ago (a dataset just made) is still dirty."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
