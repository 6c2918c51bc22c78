"""Reading item bytes from storage.

`drop_page_cache=True` tells the kernel, after the read, that the file's
pages are not needed again (`posix_fadvise(DONTNEED)`), so memory goes to the
MinIO cache instead of a second copy in the page cache that an LRU would
thrash anyway.
"""

from __future__ import annotations

import os


def read_file(path: str, drop_page_cache: bool = False) -> bytes:
    """The whole file at `path`. Raises OSError as open/read do."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        if drop_page_cache:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
