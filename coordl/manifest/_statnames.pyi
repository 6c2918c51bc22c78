"""Types of the C extension coordl/manifest/_statnames.c (stat one folder's files without the GIL)."""

from typing import Any

# out: a writable buffer of 4 x count int64 (a C-contiguous numpy array)
def stat_names(dir_fd: int, names: bytes, count: int, out: Any, /) -> int: ...
