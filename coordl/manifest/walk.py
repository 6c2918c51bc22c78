"""The directory walk behind `coordl.manifest.build.scan`: one `scandir` per folder,
one `stat` per file, and no per-file path arithmetic in Python.

Each class folder is walked top-down (files of a folder sorted by name, then
its sub-folders in sorted order), following directory symlinks as torchvision
does but remembering the (st_dev, st_ino) of every folder already visited in
that class, so a symlink loop (``cls/loop -> ..``) or two links to one folder
list each file once. Class folders are independent, so they are walked by a
small thread pool: `scandir` and `stat` release the GIL, which pays when the
metadata is not in memory (cold page cache, network filesystems). When it is
in memory, threads only add GIL hand-offs (on 2 cores 8 threads were 1.4-1.6x
slower than one), so the pool joins in only once a folder's walk was seen
blocked on storage (coordl/manifest/threads.py).

Each folder is opened once and its files are stat'ed by name relative to that
descriptor, so the kernel looks up one path component, not the whole path, and
Python builds no path per file. The C extension ``coordl.manifest._statnames``
(coordl/manifest/_statnames.c) stats a whole folder in one call without the GIL and
writes four int64 columns: no Python object per file. Where it was not built,
libc's ``statx`` through ctypes, mapped over the names, writes each file's row
of one numpy buffer; where that is missing or fails, ``os.stat(name, dir_fd=fd)``.
All three give the same columns (tests/coordl/test_manifest_scan.py).
Relative paths are built per folder, not per file: ``prefix + prefix.join(names)``
is the concatenation of every ``prefix + name`` in one C call, and their
lengths come from ``len`` mapped over the names (one encode per folder checks
that they are ASCII; otherwise each name is encoded once).

Besides the manifest's arrays, the walk returns what the persisted manifest
(coordl/manifest/store.py) needs to tell later that nothing changed: every
folder's (mtime_ns, ctime_ns, st_ino, st_dev) as stat'ed *before* it was
listed, and every file's ctime and inode.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter

import numpy as np

from coordl.errors import DatasetError
from coordl.manifest.threads import spread_all

try:
    from coordl.manifest import _statnames
except ImportError:  # the optional extension was not built (setup.py): statx through ctypes
    _statnames = None

# One stat per folder: (relative path from the root, "" for the root, mtime_ns, ctime_ns, ino, dev).
DirRecord = tuple[str, int, int, int, int]

_SIZE, _MTIME, _CTIME, _INO = (attrgetter(a) for a in ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino"))


@dataclass
class Walk:
    """Everything one walk of a root found, in manifest order."""

    classes: list[str]
    blob: bytes                 # all relative paths, utf-8 (surrogateescape), concatenated
    lengths: np.ndarray         # int64 byte length of each relative path
    sizes: np.ndarray           # int64 (-1: could not stat)
    mtimes: np.ndarray          # int64 ns (0: could not stat)
    ctimes: np.ndarray          # int64 ns (0: could not stat)
    inodes: np.ndarray          # int64 (0: could not stat)
    class_counts: np.ndarray    # int64 items per class (labels are runs of these)
    dirs: list[DirRecord]       # the root first, then every folder listed


def _dir_record(fd: int, rel: str) -> DirRecord:
    st = os.fstat(fd)
    return (rel, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _stat_all(fd: int, names: list[str]) -> list[os.stat_result | None]:
    """stat each name relative to the open folder `fd`: one path component for the kernel to look up."""
    stat_in = functools.partial(os.stat, dir_fd=fd)
    try:
        return list(map(stat_in, names))
    except OSError:  # a broken link or a vanished file: it fails (or is skipped) at read time
        out: list[os.stat_result | None] = []
        for n in names:
            try:
                out.append(stat_in(n))
            except OSError:
                out.append(None)
        return out


def _libc_statx():
    """libc's statx(2) through ctypes (glibc >= 2.28), or None where it is not there."""
    if sys.platform != "linux" or sys.byteorder != "little":
        return None
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_STATX = _libc_statx()
_STATX_BASIC, _STATX_NEEDED = 0x7FF, 0x3C0  # STATX_BASIC_STATS; STATX_MTIME|CTIME|INO|SIZE
# struct statx (linux/stat.h, the same on every architecture) as 32 int64 words, little-endian:
# word 0 low half stx_mask, 4 stx_ino, 5 stx_size, 12/13 stx_ctime (sec, nsec in the low half),
# 14/15 stx_mtime.
_LOW = 0xFFFFFFFF


def _stat_columns(fd: int, names: list[str]) -> tuple[np.ndarray, ...]:
    """(sizes, mtimes, ctimes, inodes) of the names in the open folder `fd`, following links as
    os.stat does; a name that cannot be stat'ed gets (-1, 0, 0, 0). The C extension where it
    was built, else statx through ctypes, else os.stat: all three give the same columns."""
    if not names:
        return _columns([])
    if _statnames is not None:
        return _c_columns(fd, names)
    got = _statx_columns(fd, names) if _STATX is not None else None
    return got if got is not None else _columns(_stat_all(fd, names))


def _c_columns(fd: int, names: list[str]) -> tuple[np.ndarray, ...]:
    """coordl/manifest/_statnames.c: one call per folder, no GIL, no Python object per file."""
    if _statnames is None:
        raise RuntimeError("coordl.manifest._statnames is not built (file_columns checks that first)")
    cols = np.empty((4, len(names)), dtype=np.int64)
    _statnames.stat_names(fd, ("\0".join(names) + "\0").encode("utf-8", "surrogateescape"), len(names), cols)
    return cols[0], cols[1], cols[2], cols[3]


def _statx_columns(fd: int, names: list[str]) -> tuple[np.ndarray, ...] | None:
    """libc's statx through ctypes: each call writes its row of one numpy buffer, no Python
    object per file (os.stat builds a stat_result of 20 fields, and taking 4 columns out of
    them costs as much again as the stat's own Python work). None on any failure or a field
    missing: the caller stats the folder again with os.stat, which marks what it cannot stat."""
    statx = _STATX
    if statx is None:
        return None
    k = len(names)
    buf = np.empty((k, 32), dtype=np.int64)
    base = buf.ctypes.data
    # the names NUL-terminated in one buffer, passed by address (no bytes object per name)
    joined = ("\0".join(names) + "\0").encode("utf-8", "surrogateescape")
    chars = np.fromiter(map(len, names), np.int64, k)
    if len(joined) == int(chars.sum()) + k:  # one byte per character
        starts = np.zeros(k, dtype=np.int64)
        np.cumsum(chars[:-1] + 1, out=starts[1:])
        arg = (starts + np.frombuffer(joined, dtype=np.uint8).ctypes.data).tolist()
    else:
        arg = [n.encode("utf-8", "surrogateescape") for n in names]
    rcs = list(map(statx, repeat(fd, k), arg, repeat(0, k), repeat(_STATX_BASIC, k),
                   range(base, base + 256 * k, 256)))
    if any(rcs) or not bool(((buf[:, 0] & _STATX_NEEDED) == _STATX_NEEDED).all()) \
            or not bool((buf[:, 4:6] >= 0).all()):
        return None
    return (buf[:, 5].copy(), buf[:, 14] * 1_000_000_000 + (buf[:, 15] & _LOW),
            buf[:, 12] * 1_000_000_000 + (buf[:, 13] & _LOW), buf[:, 4].copy())


def _columns(stats: list[os.stat_result | None]) -> tuple[np.ndarray, ...]:
    n = len(stats)
    if None not in stats:
        return tuple(np.fromiter(map(get, stats), np.int64, n) for get in (_SIZE, _MTIME, _CTIME, _INO))
    rows = [(s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino) if s is not None else (-1, 0, 0, 0)
            for s in stats]
    return tuple(np.array(rows, dtype=np.int64).reshape(n, 4).T.copy())


def _encode(prefix: str, names: list[str]) -> tuple[bytes, np.ndarray]:
    """The concatenated relative paths ``prefix + name`` and their byte lengths."""
    blob = (prefix + prefix.join(names)).encode("utf-8", "surrogateescape") if names else b""
    chars = np.fromiter(map(len, names), np.int64, len(names))
    plen = len(prefix.encode("utf-8", "surrogateescape"))
    if len(blob) == plen * len(names) + int(chars.sum()) and plen == len(prefix):
        return blob, chars + plen
    lens = np.fromiter((len(n.encode("utf-8", "surrogateescape")) for n in names), np.int64, len(names))
    return blob, lens + plen


def _walk_class(root: str, cls: str, exts: tuple[str, ...] | None,
                is_valid_file: Callable[[str], bool] | None) -> tuple:
    """Walk one class folder: (blobs, lengths, stat columns, dir records)."""
    blobs: list[bytes] = []
    lengths: list[np.ndarray] = []
    cols: list[tuple[np.ndarray, ...]] = []
    dirs: list[DirRecord] = []
    visited: set[tuple[int, int]] = set()
    fast = () if exts is None else tuple(exts) + tuple(x.upper() for x in exts)
    stack = [cls]
    while stack:
        rel = stack.pop()
        path = os.path.join(root, rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise DatasetError(f"cannot list dataset folder {path!r}: {e}: fix its permissions "
                               "or remove it from the dataset root") from e
        try:
            rec = _dir_record(fd, rel)
            if (rec[4], rec[3]) in visited:
                continue  # a symlink loop, or a second link to a folder already listed
            visited.add((rec[4], rec[3]))
            try:
                with os.scandir(fd) as it:
                    entries = list(it)
            except OSError as e:
                raise DatasetError(f"cannot list dataset folder {path!r}: {e}: fix its permissions "
                                   "or remove it from the dataset root") from e
            names = [e.name for e in entries if not e.is_dir()]
            subdirs = [e.name for e in entries if e.is_dir()] if len(names) < len(entries) else []
            if is_valid_file is not None:
                names = [n for n in names if is_valid_file(os.path.join(path, n))]
            elif exts is not None and names:
                # most folders hold one extension: try the first name's alone, then all of them
                first = names[0][names[0].rfind("."):]
                if not (first in fast and all(map(str.endswith, names, repeat(first)))) and \
                        not all(map(str.endswith, names, repeat(fast))):
                    names = [n for n in names if n.endswith(fast) or n.lower().endswith(exts)]
            dirs.append(rec)
            if names:
                names.sort()
                blob, lens = _encode(rel + "/", names)
                blobs.append(blob)
                lengths.append(lens)
                cols.append(_stat_columns(fd, names))
        finally:
            os.close(fd)
        # pushed in reverse so that they are popped (listed) in sorted order
        stack.extend(os.path.join(rel, n) for n in sorted(subdirs, reverse=True))
    return blobs, lengths, cols, dirs


def walk(root: str, exts: tuple[str, ...] | None, is_valid_file: Callable[[str], bool] | None,
         threads: int = 8) -> Walk:
    """Walk ``root/<class>/**/<file>``; `root` must be an absolute, existing folder."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        root_rec = _dir_record(fd, "")
    finally:
        os.close(fd)
    with os.scandir(root) as it:
        classes = sorted(e.name for e in it if e.is_dir())
    if not classes:
        raise DatasetError(
            f"dataset root {root!r} has no class sub-folders: ImageFolder expects root/<class>/<image>"
        )
    parts = spread_all(lambda c: _walk_class(root, c, exts, is_valid_file), classes,
                       min(threads, len(classes)), name="coordl-scan")
    counts = np.array([sum(len(x) for x in p[1]) for p in parts], dtype=np.int64)
    lengths = [x for p in parts for x in p[1]]
    cols = [c for p in parts for c in p[2]]
    empty = np.zeros(0, dtype=np.int64)

    def cat(k: int) -> np.ndarray:
        return np.concatenate([c[k] for c in cols]) if cols else empty

    return Walk(classes, b"".join(b for p in parts for b in p[0]),
                np.concatenate(lengths) if lengths else empty, cat(0), cat(1), cat(2), cat(3),
                counts, [root_rec] + [d for p in parts for d in p[3]])
