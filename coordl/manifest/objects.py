"""The manifest of an ImageFolder in object storage (any fsspec URL: s3://bucket/prefix, gs://, ...).

    m, store = scan_url("s3://bucket/train", storage_options={...})

The listing gives the same `Manifest` as a local scan of a copy of the same files: classes are the
first-level prefixes (sorted), items the image objects below each (recursively), in a local walk's
order (`cache/storage/policy.walk_order_key`); relpaths are keys relative to the URL, sizes the
objects' sizes, mtimes 0 (buckets keep no folder mtime and a copy's mtimes are not the objects').
`Manifest.path(i)` is the object's URL.

`Manifest.etags` holds each object's ETag as listed (never persisted: every start lists again), for
the GETs to check the object is still the one listed (If-Match: a loader serves one snapshot).

Identity (FORMAT "objects-1"): sha256 over the class names, the relative keys, sizes, labels and
each object's ETag (an ETag changes whenever an object's bytes do, so no content sample is read).
The fingerprint is the identity.

Persisted like a local manifest (coordl/manifest/store.py: same folder, same file format, one file
per (URL, endpoint, extensions, allow_empty)). A bucket has no folder mtime to check, so every start
re-lists (the class prefixes in parallel, ObjectStore.list_tree); when the listing's digest equals
the persisted one the stored arrays and fingerprint are reused (`Manifest.source` names the file),
else the manifest is rebuilt and saved. ``rescan=True`` always rebuilds.

Credentials never enter the manifest: its root, header and file name use the URL and endpoint with
secrets removed (`ObjectStore.url`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import numpy as np

from coordl.cache.storage.objstore import ObjectInfo, ObjectStore
from coordl.errors import ConfigError, DatasetError
from coordl.manifest import store

FORMAT = "objects-1"
# Listings done by this process, and how many reused a persisted manifest (tests count them).
LISTS = {"lists": 0, "reused": 0}


def is_url(root: object) -> bool:
    """Is `root` an fsspec URL (``scheme://...``) rather than a local path?"""
    return isinstance(root, str) and "://" in root and not root.startswith("file://")


def _digest(classes: Sequence[str], kept: list[ObjectInfo]) -> str:
    """sha256 of the listing: class names and each (key, size, ETag)."""
    h = hashlib.sha256(f"coordl-manifest-{FORMAT}".encode())
    h.update("\0".join(classes).encode("utf-8", "surrogateescape"))
    for o in kept:
        h.update(f"{o.key}\0{o.size}\0{o.etag or ''}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _manifest(root: str, classes: list[str], kept: list[ObjectInfo], counts: list[int], fingerprint: str,
              source: str):
    from coordl.manifest.build import Manifest, _offsets

    encoded = [o.key.encode("utf-8", "surrogateescape") for o in kept]
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    offsets = _offsets(np.array([len(e) for e in encoded], dtype=np.int64))
    sizes = np.array([o.size for o in kept], dtype=np.int64)
    labels = np.repeat(np.arange(len(classes), dtype=np.int64), counts)
    return Manifest(root, tuple(classes), blob, offsets, sizes, np.zeros(len(kept), dtype=np.int64), labels,
                    fingerprint, fingerprint, "", source, _etags(kept))


def _etags(kept: list[ObjectInfo]) -> np.ndarray:
    """The listed ETags, one fixed-width bytes row per object (b"" where the store gave none)."""
    return np.array([(o.etag or "").encode("utf-8", "surrogateescape") for o in kept], dtype=np.bytes_)


def _from_arrays(root: str, header: dict, a: dict[str, np.ndarray], path: str, kept: list[ObjectInfo]):
    from coordl.manifest.build import Manifest, _offsets

    labels = np.repeat(np.arange(len(a["class_counts"]), dtype=np.int64), a["class_counts"])
    n = len(a["sizes"])
    return Manifest(root, tuple(header["classes"]), a["blob"], _offsets(a["lengths"].astype(np.int64)),
                    a["sizes"].astype(np.int64), np.zeros(n, dtype=np.int64), labels, header["fingerprint"],
                    header["fingerprint"], "", path, _etags(kept))


def _check_classes(url: str, classes: list[str], counts: list[int], exts: tuple[str, ...],
                   allow_empty: bool) -> None:
    if not classes:
        raise DatasetError(f"{url}: no class prefixes below it (the dataset must be <url>/<class>/<image>): "
                           "check the URL, or upload the class folders under it")
    if not allow_empty:
        for cls, count in zip(classes, counts):
            if count == 0:
                raise DatasetError(f"class prefix {url}/{cls}/ holds no image (extensions {', '.join(exts)}): "
                                   "remove it, add images, or pass on_error='skip' to keep it as an empty class")
    if sum(counts) == 0:
        raise DatasetError(f"{url}: no image object in any class prefix (extensions {', '.join(exts)})")


def scan_url(url: str, extensions: Sequence[str], allow_empty: bool = False, *,
             storage_options: dict | None = None, max_in_flight: int = 32, rescan: bool = False,
             manifest_cache: str | os.PathLike | None = None, fetch_client: str | None = None):
    """(the Manifest of the ImageFolder at `url`, its ObjectStore). Raises a coordl error naming the
    URL (without secrets) and the fix for a missing bucket or prefix or bad credentials."""
    if extensions is None or isinstance(extensions, str):
        raise ConfigError(f"extensions={extensions!r}: pass a sequence of file endings such as ('.jpg', '.png')")
    exts = tuple(e.lower() for e in extensions)
    objects = ObjectStore.from_url(url, storage_options, max_in_flight=max_in_flight, fetch_client=fetch_client)
    root = objects.url
    classes, kept, counts = objects.list_images(exts)
    LISTS["lists"] += 1
    _check_classes(root, classes, counts, exts, allow_empty)
    digest = _digest(classes, kept)
    folder = store.directory(manifest_cache)
    if folder is None:
        return _manifest(root, classes, kept, counts, digest, "scan"), objects
    params = {"kind": FORMAT, "endpoint": objects.endpoint(), "extensions": exts, "allow_empty": bool(allow_empty)}
    path = store.entry_path(folder, root, params)
    try:
        with store.locked(path):
            header = store.read_header(path)
            if not rescan and header is not None and header.get("root") == root and header.get("listing") == digest:
                arrays = store.read_arrays(path, header)
                if arrays is not None:
                    LISTS["reused"] += 1
                    return _from_arrays(root, header, arrays, path, kept), objects
            m = _manifest(root, classes, kept, counts, digest, "scan")
            header = {"root": root, "classes": classes, "n": len(kept), "listing": digest, "identity": digest,
                      "revision": "", "fingerprint": digest}
            arrays = {"blob": m.paths_blob, "lengths": np.diff(m.path_offsets), "sizes": m.sizes,
                      "class_counts": np.array(counts, dtype=np.int64)}
            store.save(path, header, arrays)
            return m, objects
    except OSError as e:
        store.warn(path, e, manifest_cache)
        return _manifest(root, classes, kept, counts, digest, "scan"), objects
