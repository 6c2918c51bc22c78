"""The dataset manifest: the sorted list of (relative path, size, label).

Items are integers into the manifest. Everything is held in a few flat numpy
arrays (one bytes blob for all paths plus offsets), never one Python object
per item, so worker processes that fork from the loader share the pages
instead of copying them on access.

`scan` builds it: it loads the persisted manifest of an unchanged root
(coordl/manifest/store.py says what "unchanged" means and where the file
lives), or walks the tree (coordl/manifest/walk.py) and persists the result.
The fingerprint that names the dataset in every cache key, segment and Redis
key covers paths, sizes, labels, whole-second mtimes and the bytes of a
deterministic sample of files; the exact rule, and how a same-size edit with
its mtime restored is caught, is in coordl/manifest/identity.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from coordl.errors import DatasetError
from coordl.manifest import identity as ident
from coordl.manifest import store as store
from coordl.manifest.walk import Walk, walk

IMG_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
)

SCAN_THREADS = 8
# Full walks of a tree done by this process (tests count them; a load from the store is not one).
SCANS = {"walks": 0, "loads": 0}


@dataclass(frozen=True)
class Manifest:
    root: str
    classes: tuple[str, ...]
    paths_blob: np.ndarray   # uint8: all relative paths, utf-8, concatenated
    path_offsets: np.ndarray  # int64, len n+1: path i is blob[off[i]:off[i+1]]
    sizes: np.ndarray         # int64 file sizes in bytes (-1: could not stat)
    mtimes: np.ndarray        # int64 modification times in ns
    labels: np.ndarray        # int64 class index per item
    fingerprint: str          # sha256 hex (manifest_identity; first 16 chars used in names)
    identity: str = ""        # the portable part of the fingerprint (equal on faithful copies)
    revision: str = ""        # local silent-revision token ("" unless a rescan found one)
    source: str = "scan"      # "scan" (walked now) or the persisted manifest file it was loaded from
    etags: np.ndarray | None = None  # bytes (S dtype): each object's ETag when listed (objects.py; None: local)

    def __len__(self) -> int:
        return len(self.sizes)

    def relpath(self, i: int) -> str:
        lo, hi = self.path_offsets[i], self.path_offsets[i + 1]
        return self.paths_blob[lo:hi].tobytes().decode("utf-8", "surrogateescape")

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.relpath(i))

    @property
    def total_bytes(self) -> int:
        return int(self.sizes[self.sizes > 0].sum())


def scan(
    root: str | os.PathLike[str],
    extensions: Sequence[str] | None = IMG_EXTENSIONS,
    is_valid_file: Callable[[str], bool] | None = None,
    allow_empty: bool = False,
    *,
    rescan: bool = False,
    manifest_cache: str | os.PathLike | None = None,
) -> Manifest:
    """The manifest of an ImageFolder tree ``root/<class>/**/<file>``.

    Classes are the sorted sub-folder names; files are sorted by relative
    path. ``allow_empty`` keeps a class folder that holds no valid file
    (its index stays reserved) instead of raising. ``rescan=True`` walks the
    tree even if a persisted manifest says it is unchanged; ``manifest_cache``
    is the folder of persisted manifests (None: the default, "off": none).
    """
    root = os.path.abspath(os.path.expanduser(os.fspath(root)))
    if not os.path.isdir(root):
        raise DatasetError(
            f"dataset root {root!r} does not exist or is not a folder: pass the folder that "
            "holds one sub-folder per class (root/<class>/<image>), e.g. made with "
            "`coordl make-dataset DIR`"
        )
    exts = None if is_valid_file is not None else tuple(e.lower() for e in (extensions or IMG_EXTENSIONS))
    folder = None if is_valid_file is not None else store.directory(manifest_cache)
    if folder is None:
        return _build(root, exts, is_valid_file, extensions, allow_empty, None)[0]
    path = store.entry_path(folder, root, {"extensions": exts, "allow_empty": bool(allow_empty)})
    waiting_since = time.time_ns()
    try:
        lock = store.locked(path)
        lock.__enter__()
    except OSError as e:
        store.warn(path, e, manifest_cache)
        return _build(root, exts, is_valid_file, extensions, allow_empty, None)[0]
    try:
        header, damage = store.load_header(path)
        if header is not None and header.get("root") != root:
            header = None
        arrays = None
        if header is not None and not rescan:
            same, arrays = store.load_unchanged(path, header, root, waiting_since)
            if same and arrays is not None:
                SCANS["loads"] += 1
                return _from_store(root, header, arrays, path)
        previous = None
        if header is not None:
            if arrays is None:
                arrays = store.read_arrays(path, header, local=True)
            else:
                local = store.read_arrays(path, header, only_local=True)
                arrays = None if local is None else {**arrays, **local}
            previous = None if arrays is None else (header, arrays)
            damage = "" if arrays is not None else "an array fails its checksum"
        if damage:
            store.warn_damaged(path, damage)
        m, record = _build(root, exts, is_valid_file, extensions, allow_empty, previous)
        try:
            store.save(path, *record)
        except OSError as e:
            store.warn(path, e, manifest_cache)
        return m
    finally:
        lock.__exit__(None, None, None)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def _from_store(root: str, header: dict, a: dict[str, np.ndarray], path: str) -> Manifest:
    labels = np.repeat(np.arange(len(a["class_counts"]), dtype=np.int64), a["class_counts"])
    return Manifest(root, tuple(header["classes"]), a["blob"], _offsets(a["lengths"].astype(np.int64)),
                    a["sizes"].astype(np.int64), a["mtimes"], labels, header["fingerprint"],
                    header["identity"], header["revision"], path)


def _narrow(a: np.ndarray, dtypes: tuple[type, ...]) -> np.ndarray:
    """`a` in the first of `dtypes` that holds all its values (a smaller file to read at restart)."""
    lo, hi = (int(a.min()), int(a.max())) if len(a) else (0, 0)
    for dt in dtypes:
        if np.iinfo(dt).min <= lo and hi <= np.iinfo(dt).max:
            return a.astype(dt)
    return a


def _build(root, exts, is_valid_file, extensions, allow_empty, previous) -> tuple[Manifest, tuple]:
    scan_ns = time.time_ns()
    w = walk(root, exts, is_valid_file, SCAN_THREADS)
    SCANS["walks"] += 1
    if not allow_empty:
        for cls, count in zip(w.classes, w.class_counts.tolist()):
            if count == 0:
                raise DatasetError(
                    f"class folder {os.path.join(root, cls)!r} holds no image "
                    f"(extensions {', '.join(extensions or IMG_EXTENSIONS)}): remove the folder, "
                    "add images to it, or pass on_error='skip' to keep it as an empty class"
                )
    if len(w.sizes) == 0:
        raise DatasetError(f"dataset root {root!r} holds no image file in any class folder")
    blob = np.frombuffer(w.blob, dtype=np.uint8)
    offsets = _offsets(w.lengths)
    labels = np.repeat(np.arange(len(w.classes), dtype=np.int64), w.class_counts)
    pos = ident.sample_positions(len(w.sizes))
    rels = [blob[offsets[i]:offsets[i + 1]].tobytes().decode("utf-8", "surrogateescape") for i in pos.tolist()]
    content = ident.content_digest([os.path.join(root, r) for r in rels], pos, SCAN_THREADS)
    identity = ident.identity(w.classes, blob, offsets, w.sizes, w.mtimes, labels, content)
    revision = ""
    if previous is not None:
        revision = ident.next_revision(previous[0].get("revision", ""), *_silent_revisions(w, previous))
    fp = ident.fingerprint(identity, revision)
    m = Manifest(root, tuple(w.classes), blob, offsets, w.sizes, w.mtimes, labels, fp, identity, revision)
    sample = [[r, [int(w.sizes[i]), int(w.mtimes[i]), int(w.ctimes[i]), int(w.inodes[i])]
               if w.sizes[i] >= 0 else None] for r, i in zip(rels, pos.tolist())]
    header = {"root": root, "classes": w.classes, "n": len(w.sizes), "scan_ns": scan_ns,
              "racy": store.is_racy(w.dirs, scan_ns), "dirs": [list(d) for d in w.dirs],
              "sample": sample, "identity": identity, "revision": revision, "fingerprint": fp}
    arrays = {"blob": blob, "lengths": _narrow(w.lengths, (np.uint8, np.uint16)),
              "sizes": _narrow(w.sizes, (np.int32,)), "mtimes": w.mtimes,
              "class_counts": w.class_counts, "ctimes": w.ctimes, "inodes": w.inodes}
    return m, (header, arrays)


def _pairs(w: Walk, old: dict[str, np.ndarray], old_classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(new item, old item) index pairs of the files with the same relative path in both scans:
    positional for each class whose file list is unchanged, by path only in the classes that changed."""
    new_off, old_off = _offsets(w.lengths), _offsets(old["lengths"].astype(np.int64))
    new_blob, old_blob = np.frombuffer(w.blob, dtype=np.uint8), old["blob"]
    new_start, old_start = _offsets(w.class_counts), _offsets(old["class_counts"])
    old_of = {c: k for k, c in enumerate(old_classes)}
    ns, os_ = [], []
    for k, cls in enumerate(w.classes):
        j = old_of.get(cls)
        if j is None:
            continue
        a, b = int(new_start[k]), int(new_start[k + 1])
        c, d = int(old_start[j]), int(old_start[j + 1])
        na, oa = new_off[a:b + 1] - new_off[a], old_off[c:d + 1] - old_off[c]
        if b - a == d - c and np.array_equal(na, oa) and np.array_equal(
                new_blob[new_off[a]:new_off[b]], old_blob[old_off[c]:old_off[d]]):
            ns.append(np.arange(a, b, dtype=np.int64))
            os_.append(np.arange(c, d, dtype=np.int64))
            continue
        where = {old_blob[old_off[i]:old_off[i + 1]].tobytes(): i for i in range(c, d)}
        hits = [(i, where.get(new_blob[new_off[i]:new_off[i + 1]].tobytes(), -1)) for i in range(a, b)]
        ns.append(np.array([i for i, h in hits if h >= 0], dtype=np.int64))
        os_.append(np.array([h for _, h in hits if h >= 0], dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return (np.concatenate(ns) if ns else empty), (np.concatenate(os_) if os_ else empty)


def _silent_revisions(w: Walk, previous: tuple[dict, dict]) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Files whose size and whole-second mtime match the previous scan's but whose
    (mtime_ns, ctime_ns, inode) do not (manifest_identity.py, "silent revision")."""
    header, old = previous
    n, o = _pairs(w, old, header["classes"])
    same_identity = (w.sizes[n] == old["sizes"][o]) & (w.sizes[n] >= 0) & (
        w.mtimes[n] // 1_000_000_000 == old["mtimes"][o] // 1_000_000_000)
    moved = (w.mtimes[n] != old["mtimes"][o]) | (w.ctimes[n] != old["ctimes"][o]) | (w.inodes[n] != old["inodes"][o])
    hit = n[same_identity & moved]
    off = _offsets(w.lengths)
    rels = [w.blob[off[i]:off[i + 1]] for i in hit.tolist()]
    return rels, w.ctimes[hit], w.inodes[hit]
