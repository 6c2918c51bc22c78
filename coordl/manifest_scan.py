"""The directory walk behind `coordl.manifest.scan`: one `scandir` per folder,
one `stat` per file, and no per-file path arithmetic in Python.

Each class folder is walked top-down (files of a folder sorted by name, then
its sub-folders in sorted order), following directory symlinks as torchvision
does but remembering the (st_dev, st_ino) of every folder already visited in
that class, so a symlink loop (``cls/loop -> ..``) or two links to one folder
list each file once. Class folders are independent, so they are walked by a
small thread pool: `scandir` and `stat` release the GIL, which pays when the
metadata is not in memory (cold page cache, network filesystems).

Files are stat'ed in inode order (DirEntry.inode() comes with the listing, at no
cost), which reads a cold inode table front to back, then put in name order by
one permutation. Relative paths are built per folder, not per file: ``prefix + prefix.join(names)``
is the concatenation of every ``prefix + name`` in one C call, and their
lengths come from ``len`` mapped over the names (one encode per folder checks
that they are ASCII; otherwise each name is encoded once). File metadata is
taken out of the `os.stat_result`s with ``map(attrgetter(...))`` into numpy.

Besides the manifest's arrays, the walk returns what the persisted manifest
(coordl/manifest_store.py) needs to tell later that nothing changed: every
folder's (mtime_ns, ctime_ns, st_ino, st_dev) as stat'ed *before* it was
listed, and every file's ctime and inode.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from .errors import DatasetError

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


def _dir_record(path: str, rel: str) -> DirRecord:
    st = os.stat(path)
    return (rel, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _stat_all(paths: list[str]) -> list[os.stat_result | None]:
    try:
        return list(map(os.stat, paths))
    except OSError:  # a broken link or a vanished file: it fails (or is skipped) at read time
        out: list[os.stat_result | None] = []
        for p in paths:
            try:
                out.append(os.stat(p))
            except OSError:
                out.append(None)
        return out


def _columns(stats: list[os.stat_result | None]) -> tuple[np.ndarray, ...]:
    n = len(stats)
    if all(s is not None for s in stats):
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
    stack = [cls]
    while stack:
        rel = stack.pop()
        path = os.path.join(root, rel)
        try:
            rec = _dir_record(path, rel)
            if (rec[4], rec[3]) in visited:
                continue  # a symlink loop, or a second link to a folder already listed
            visited.add((rec[4], rec[3]))
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as e:
            raise DatasetError(f"cannot list dataset folder {path!r}: {e}: fix its permissions "
                               "or remove it from the dataset root") from e
        subdirs, files = [], []
        for e in entries:
            (subdirs if e.is_dir() else files).append(e)
        if is_valid_file is not None:
            files = [e for e in files if is_valid_file(e.path)]
        elif exts is not None:
            files = [e for e in files if e.name.lower().endswith(exts)]
        dirs.append(rec)
        if files:
            # stat in inode order (the inode table is read front to back when cold), then put
            # everything in name order with one permutation
            files.sort(key=os.DirEntry.inode)
            stats = _columns(_stat_all([e.path for e in files]))
            names = [e.name for e in files]
            order = sorted(range(len(names)), key=names.__getitem__)
            names = [names[i] for i in order]
            blob, lens = _encode(rel + "/", names)
            blobs.append(blob)
            lengths.append(lens)
            perm = np.array(order, dtype=np.int64)
            cols.append(tuple(c[perm] for c in stats))
        # pushed in reverse so that they are popped (listed) in sorted order
        stack.extend(os.path.join(rel, e.name) for e in sorted(subdirs, key=attrgetter("name"), reverse=True))
    return blobs, lengths, cols, dirs


def walk(root: str, exts: tuple[str, ...] | None, is_valid_file: Callable[[str], bool] | None,
         threads: int = 8) -> Walk:
    """Walk ``root/<class>/**/<file>``; `root` must be an absolute, existing folder."""
    root_rec = _dir_record(root, "")
    with os.scandir(root) as it:
        classes = sorted(e.name for e in it if e.is_dir())
    if not classes:
        raise DatasetError(
            f"dataset root {root!r} has no class sub-folders: ImageFolder expects root/<class>/<image>"
        )
    if threads > 1 and len(classes) > 1:
        with ThreadPoolExecutor(min(threads, len(classes)), thread_name_prefix="coordl-scan") as pool:
            parts = list(pool.map(lambda c: _walk_class(root, c, exts, is_valid_file), classes))
    else:
        parts = [_walk_class(root, c, exts, is_valid_file) for c in classes]
    counts = np.array([sum(len(x) for x in p[1]) for p in parts], dtype=np.int64)
    lengths = [x for p in parts for x in p[1]]
    cols = [c for p in parts for c in p[2]]
    empty = np.zeros(0, dtype=np.int64)

    def cat(k: int) -> np.ndarray:
        return np.concatenate([c[k] for c in cols]) if cols else empty

    return Walk(classes, b"".join(b for p in parts for b in p[0]),
                np.concatenate(lengths) if lengths else empty, cat(0), cat(1), cat(2), cat(3),
                counts, [root_rec] + [d for p in parts for d in p[3]])
