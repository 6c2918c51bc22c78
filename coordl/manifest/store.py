"""The persisted manifest: a root scanned once is loaded, not rescanned, at every later start.

Where: ``$COORDL_MANIFEST_CACHE``, else ``$XDG_CACHE_HOME/coordl/manifests``,
else ``~/.cache/coordl/manifests``; ``ImageFolder(..., manifest_cache=DIR)``
names another folder and ``manifest_cache="off"`` (or the variable set to
``off``) turns it off. One file per (root, extensions, allow_empty), named by
their sha256. A custom ``is_valid_file`` is a function coordl cannot compare
between runs, so a dataset built with one is always scanned.

"Unchanged", checked at every start before the file's arrays are read:

1. the file is whole: its magic and format match, and xxh3 checksums cover
   the header (the JSON: classes, folders, sample, fingerprint) and each
   array. A file with coordl's magic that fails a checksum or its recorded
   size is *damaged*: it is not loaded, one `ManifestCacheWarning` says so,
   and the rescan rewrites it;
2. the root and every folder the scan listed (class folders, their
   sub-folders, folders reached through symlinks) have the (st_mtime_ns,
   st_ctime_ns, st_ino, st_dev) they had *before* the scan listed them:
   adding, removing or renaming an entry changes its folder's mtime and ctime,
   and ``os.utime`` cannot set a ctime back;
3. each sampled file (manifest_identity.sample_positions) has the
   (st_size, st_mtime_ns, st_ctime_ns, st_ino) recorded: the files whose bytes
   are in the fingerprint cannot change under it;
4. no recorded folder is *racy*: its mtime is older than RACY_NS before the
   scan began (a change in the same timestamp tick as the folder's last one
   would not move its mtime, as git's "racy index" rule says). A racy
   manifest is still written, and is used only by processes that started
   waiting for it before its scan began (ranks starting together on a fresh
   tree scan once); every later start rescans until the folders settle.

Rules 2 and 3 are checked while another thread reads the arrays. Cold, each
of those ~2,000 `stat` calls waits on a random read of an inode table (128 KiB
with ext4's inode readahead), so one thread spends most of a restart waiting:
once the checks are seen waiting, STAT_THREADS threads keep that many reads in
flight (coordl/manifest/threads.py; warm, they stay on one thread). Every
check is still made; the first mismatch stops the rest.

Anything else rescans the whole root; so does ``rescan=True``. What the check
cannot see: a file rewritten in place (same path, no rename) outside the
sample; run with ``rescan=True`` after editing files in place (see
manifest_identity.py for what the full scan then catches).

Writers: a flock on ``<file>.lock`` makes one process scan while the others
of the same moment wait and then load its result (the lock dies with its
process); the file is written under a temporary name in the same folder and
renamed over the old one, so a reader sees the old file or the new one, never
a torn one. A folder coordl cannot create or write means a scan and one
`ManifestCacheWarning` naming where the folder came from (the argument, the
variable or the default) and what to set, never an error.

Layout: the index file of cache/indexfile.py (MAGIC, the header under its
checksum, the arrays under theirs), with the header's ``format`` (identity.FORMAT).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import warnings
from collections.abc import Iterator

import numpy as np

from coordl.cache import indexfile
from coordl.manifest.identity import FORMAT
from coordl.manifest.threads import spread_map

MAGIC = b"COORDLM3"  # M3: the header under a checksum (M2 files are rescanned)
RACY_NS = 2_000_000_000
ENV = "COORDL_MANIFEST_CACHE"
LOCAL_ARRAYS = ("ctimes", "inodes")  # read only when a rescan compares against the old scan
STAT_THREADS = 32   # restart check: stats in flight at once (see the module docstring)
_STAT_CHUNK = 16    # checks per task (fewer hand-offs when everything is cached)


class ManifestCacheWarning(UserWarning):
    """The persisted-manifest folder cannot be used; the dataset was scanned instead."""


def directory(manifest_cache: str | os.PathLike | None) -> str | None:
    """The folder for persisted manifests, or None when turned off."""
    value = os.fspath(manifest_cache) if manifest_cache is not None else os.environ.get(ENV)
    if value is not None:
        return None if value in ("off", "") else os.path.abspath(os.path.expanduser(value))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "coordl", "manifests")


def entry_path(folder: str, root: str, params: dict) -> str:
    key = json.dumps({"root": root, **params}, sort_keys=True).encode("utf-8", "surrogatepass")
    return os.path.join(folder, hashlib.sha256(key).hexdigest()[:32] + ".manifest")


def origin(manifest_cache: str | os.PathLike | None) -> str:
    """Where the manifest folder came from, and what to set to move it (for warnings)."""
    if manifest_cache is not None:
        return (f"the folder comes from ImageFolder(manifest_cache={os.fspath(manifest_cache)!r}): pass "
                "manifest_cache=<a writable folder>, or manifest_cache='off' to turn persisting off")
    if os.environ.get(ENV):
        return (f"the folder comes from {ENV}={os.environ[ENV]!r}: set {ENV} to a writable folder "
                f"(or {ENV}=off), or pass ImageFolder(manifest_cache=<a writable folder>)")
    return (f"the folder is the default ($XDG_CACHE_HOME or ~/.cache, then coordl/manifests): set "
            f"{ENV}=<a writable folder> (every command, e.g. coordl serve, reads it) or pass "
            f"ImageFolder(manifest_cache=<a writable folder>); {ENV}=off or manifest_cache='off' "
            "turns persisting off")


def warn(path: str, e: OSError, manifest_cache: str | os.PathLike | None = None) -> None:
    warnings.warn(f"persisted manifest {path!r} cannot be used ({e}): the dataset is scanned at every "
                  f"start; {origin(manifest_cache)}", ManifestCacheWarning, stacklevel=4)


def warn_damaged(path: str, reason: str) -> None:
    warnings.warn(f"persisted manifest {path!r} is damaged ({reason}): it was not loaded; the dataset "
                  "was rescanned and the file rewritten. If this repeats, check the disk that holds "
                  "it, or pass manifest_cache='off'", ManifestCacheWarning, stacklevel=4)


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold the writer lock of one manifest file (raises OSError if the folder is unusable)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # no lock support (some network filesystems): race, harmlessly
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_header(path: str) -> tuple[dict | None, str]:
    """(the header of a persisted manifest, "") or (None, why it is damaged); (None, "") if the
    file is missing, unreadable or foreign (another magic or format: rescanned in silence)."""
    return indexfile.load_header(path, MAGIC, FORMAT)


def read_header(path: str) -> dict | None:
    """The header of a persisted manifest, or None if missing, foreign, torn or damaged."""
    return load_header(path)[0]


def read_arrays(path: str, header: dict, local: bool = False,
                only_local: bool = False) -> dict[str, np.ndarray] | None:
    """The arrays of a persisted manifest (with ctimes/inodes when `local`; those alone when
    `only_local`), or None if torn."""
    names = [name for name in header.get("arrays", {})
             if (name in LOCAL_ARRAYS and (local or only_local)) or (name not in LOCAL_ARRAYS and not only_local)]
    return indexfile.read_arrays(path, header, names)


def _stat_key(path: str, fields: tuple[str, ...]) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [getattr(st, f) for f in fields]


_DIR_FIELDS = ("st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")
_FILE_FIELDS = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino")


def _checks(header: dict, root: str) -> list[tuple[str, tuple[str, ...], list]]:
    """(path, stat fields, recorded values) of every folder and sampled file (rules 2 and 3)."""
    out: list[tuple[str, tuple[str, ...], list]] = [
        (os.path.join(root, rel) if rel else root, _DIR_FIELDS, rec) for rel, *rec in header["dirs"]]
    out += [(os.path.join(root, rel), _FILE_FIELDS, rec) for rel, rec in header["sample"]]
    return out


def _all_match(checks: list[tuple[str, tuple[str, ...], list]]) -> bool:
    return all(_stat_key(path, fields) == rec for path, fields, rec in checks)


def load_unchanged(path: str, header: dict, root: str,
                   waiting_since_ns: int) -> tuple[bool, dict[str, np.ndarray] | None]:
    """(rules 2-4 of the module docstring hold, the arrays or None if torn: rule 1): the stats on
    STAT_THREADS threads while one more reads the arrays; a manifest that is racy for this
    process is neither stat'ed nor read."""
    if header.get("racy") and header["scan_ns"] < waiting_since_ns:
        return False, None
    checks = _checks(header, root)
    parts = [checks[i:i + _STAT_CHUNK] for i in range(0, len(checks), _STAT_CHUNK)]
    arrays: list = [None]
    reader = threading.Thread(target=lambda: arrays.__setitem__(0, read_arrays(path, header)),
                              name="coordl-manifest-read", daemon=True)
    reader.start()
    try:  # the first mismatch stops the other checks
        same = False not in spread_map(_all_match, parts, STAT_THREADS, until=lambda ok: not ok)
    finally:
        reader.join()
    return same, arrays[0]


def is_racy(dirs: list, scan_ns: int) -> bool:
    return any(d[1] >= scan_ns - RACY_NS for d in dirs)


def save(path: str, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write header + arrays under a temporary name, then rename it over `path` (cache/indexfile.py)."""
    indexfile.save(path, MAGIC, {**header, "format": FORMAT}, arrays)
