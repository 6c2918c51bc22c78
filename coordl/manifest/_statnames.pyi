"""Types of the C extension coordl/manifest/_statnames.c (stat one folder's files without the GIL)."""

from typing_extensions import Buffer

def stat_names(dir_fd: int, names: bytes, count: int, out: Buffer, /) -> int: ...
