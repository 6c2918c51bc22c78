"""The dataset manifest: the sorted list of (relative path, size, label).

Items are integers into the manifest. Everything is held in a few flat numpy
arrays (one bytes blob for all paths plus offsets), never one Python object
per item, so worker processes that fork from the loader share the pages
instead of copying them on access. The manifest's hash is the dataset
fingerprint: every cache key and shared-memory name carries it, so a changed
file (new size or modification time) can never be served stale bytes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import DatasetError

IMG_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
)


@dataclass(frozen=True)
class Manifest:
    root: str
    classes: tuple[str, ...]
    paths_blob: np.ndarray   # uint8: all relative paths, utf-8, concatenated
    path_offsets: np.ndarray  # int64, len n+1: path i is blob[off[i]:off[i+1]]
    sizes: np.ndarray         # int64 file sizes in bytes (-1: could not stat)
    mtimes: np.ndarray        # int64 modification times in ns
    labels: np.ndarray        # int64 class index per item
    fingerprint: str          # sha256 hex of the manifest (first 16 chars used in names)

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
    root: str,
    extensions: Sequence[str] | None = IMG_EXTENSIONS,
    is_valid_file: Callable[[str], bool] | None = None,
    allow_empty: bool = False,
) -> Manifest:
    """Build the manifest of an ImageFolder tree: ``root/<class>/**/<file>``.

    Classes are the sorted sub-folder names; files are sorted by relative
    path. ``allow_empty`` keeps a class folder that holds no valid file
    (its index stays reserved) instead of raising.
    """
    root = os.path.abspath(os.path.expanduser(os.fspath(root)))
    if not os.path.isdir(root):
        raise DatasetError(
            f"dataset root {root!r} does not exist or is not a folder: pass the folder that "
            "holds one sub-folder per class (root/<class>/<image>), e.g. made with "
            "`coordl make-dataset DIR`"
        )
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise DatasetError(
            f"dataset root {root!r} has no class sub-folders: ImageFolder expects root/<class>/<image>"
        )
    if is_valid_file is None:
        exts = tuple(e.lower() for e in (extensions or IMG_EXTENSIONS))

        def is_valid_file(p: str) -> bool:
            return p.lower().endswith(exts)

    rels: list[bytes] = []
    sizes: list[int] = []
    mtimes: list[int] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        found = 0
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, cls), followlinks=True):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                if not is_valid_file(full):
                    continue
                try:
                    st = os.stat(full)
                    size, mtime = st.st_size, st.st_mtime_ns
                except OSError:  # broken link, vanished file: fails (or is skipped) at read time
                    size, mtime = -1, 0
                rels.append(os.path.relpath(full, root).encode("utf-8", "surrogateescape"))
                sizes.append(size)
                mtimes.append(mtime)
                labels.append(label)
                found += 1
        if found == 0 and not allow_empty:
            raise DatasetError(
                f"class folder {os.path.join(root, cls)!r} holds no image "
                f"(extensions {', '.join(extensions or IMG_EXTENSIONS)}): remove the folder, "
                "add images to it, or pass on_error='skip' to keep it as an empty class"
            )
    if not rels:
        raise DatasetError(f"dataset root {root!r} holds no image file in any class folder")
    offsets = np.zeros(len(rels) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rels], out=offsets[1:])
    blob = np.frombuffer(b"".join(rels), dtype=np.uint8)
    size_arr = np.asarray(sizes, dtype=np.int64)
    mtime_arr = np.asarray(mtimes, dtype=np.int64)
    label_arr = np.asarray(labels, dtype=np.int64)
    h = hashlib.sha256()
    h.update("\0".join(classes).encode())
    for arr in (offsets, size_arr, mtime_arr, label_arr):
        h.update(arr.tobytes())
    h.update(blob.tobytes())
    return Manifest(root, tuple(classes), blob, offsets, size_arr, mtime_arr, label_arr, h.hexdigest())
