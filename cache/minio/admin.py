"""Inspect, drop and clean up MinIO cache segments on this node (`coordl cache ...`).

Whose: a segment belongs to the user that owns its file. Other users'
segments (a shared node) are listed by `foreign` and never opened, dropped or
cleaned up here, whoever runs the command (root included): they are theirs
to drop. `drop` of one named segment is the exception, and the kernel decides
(it is refused with the owner's name when the file is not ours to remove).

Stale: a segment is superseded when a newer segment in the folder was made
for the same dataset root (the label) with another fingerprint, i.e. the
dataset changed and its loaders moved on. `coordl cache ls` marks it stale
and `coordl cleanup --caches` removes it once nothing is attached.

Cleanup: a cache is meant to outlive its loader (the next job over the same
dataset hits at once), so a complete cache is removed only when asked
(`cleanup`, i.e. ``coordl cleanup --caches``). What is dead is always removed
(`cleanup_half_built`: a segment whose builder died before publishing it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from coordl.errors import CacheError

from .. import shm
from ..shm import Removed
from .layout import Segment

CACHE = "cache segment"
HALF_BUILT = "half-built cache segment"


@dataclass(frozen=True)
class CacheInfo:
    name: str            # segment file name in the directory
    fingerprint: str     # dataset fingerprint (sha256 hex of its manifest)
    label: str           # the dataset's root folder, as the creator gave it
    capacity: int        # arena bytes
    used: int            # arena bytes reserved (only grows)
    cached_bytes: int    # encoded bytes of the cached items
    items: int           # cached items
    n_items: int         # items in the dataset
    creator_pid: int
    creator_alive: bool
    attached: tuple[int, ...]  # living processes in the pid table
    created_ns: int = 0  # when it was created (time.time_ns())
    corrupt: int = 0     # entries found not to match their checksum
    stale: bool = False  # superseded by a newer segment of the same label (see module doc)


@dataclass(frozen=True)
class Foreign:
    """A coordl segment another user owns: listed, never touched."""
    name: str
    uid: int
    size: int

    @property
    def owner(self) -> str:
        return shm.user_name(self.uid)


def _read(directory: str, name: str) -> CacheInfo:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDONLY)
    seg = Segment(fd, path, writable=False, whole=False)
    try:
        return CacheInfo(
            name, seg.fingerprint, seg.field("label").decode("utf-8", "replace"), seg.capacity,
            seg.used, seg.cached_bytes(), seg.cached_items(), seg.n_items,
            int(seg.field("creator_pid")), seg.creator_alive(), tuple(seg.attached()),
            int(seg.field("created_ns")), seg.corrupt_items())
    finally:
        seg.close()


def _mine(directory: str, name: str) -> bool:
    return shm.owner_uid(os.path.join(directory, name)) == os.getuid()


def _mark_stale(infos: list[CacheInfo]) -> list[CacheInfo]:
    """Mark each segment that a newer one of the same label (dataset root) supersedes."""
    newest: dict[str, CacheInfo] = {}
    for c in infos:
        if c.label and (c.label not in newest or c.created_ns > newest[c.label].created_ns):
            newest[c.label] = c
    return [CacheInfo(**{**c.__dict__, "stale": True})
            if c.label and newest[c.label].fingerprint != c.fingerprint else c for c in infos]


def list_caches(directory: str = shm.SHM_DIR) -> list[CacheInfo]:
    """This user's readable cache segments in `directory` (others': `foreign`), stale ones marked."""
    out = []
    for name in shm.list_names(directory):
        if not _mine(directory, name):
            continue
        try:
            out.append(_read(directory, name))
        except (OSError, CacheError):
            continue
    return _mark_stale(out)


def unreadable(directory: str = shm.SHM_DIR) -> list[tuple[str, str]]:
    """(name, why) of this user's cache segments that cannot be read (another layout version, a
    truncated file): `coordl cache ls` names them, `coordl cache drop NAME` removes them."""
    out = []
    for name in shm.list_names(directory):
        if _mine(directory, name):
            try:
                _read(directory, name)
            except (OSError, CacheError) as e:
                out.append((name, str(e)))
    return out


def foreign(directory: str = shm.SHM_DIR, prefix: str = shm.PREFIX) -> list[Foreign]:
    """Other users' segments in `directory` whose names start with `prefix` (default: caches)."""
    out = []
    for name, uid in shm.others(directory, prefix):
        try:
            size = os.lstat(os.path.join(directory, name)).st_size
        except FileNotFoundError:
            continue
        out.append(Foreign(name, uid, size))
    return out


def resolve(directory: str, name: str) -> str:
    """A segment name from its full name, the part after the prefix, or a fingerprint prefix."""
    names = shm.list_names(directory)
    for candidate in (name, shm.PREFIX + name):
        if candidate in names:
            return candidate
    matches = [n for n in names if n[len(shm.PREFIX):].startswith(name[:16]) and len(name) >= 4]
    if len(matches) == 1:
        return matches[0]
    raise CacheError(f"no cache segment {name!r} in {directory}: `coordl cache ls` lists them "
                     f"({', '.join(names) or 'there are none'})")


def drop(directory: str, name: str) -> str:
    """Unlink one segment; attached processes keep their mapping until they close."""
    name = resolve(directory, name)
    path = os.path.join(directory, name)
    try:
        os.unlink(path)
    except PermissionError:
        raise CacheError(f"cache segment {path} belongs to {shm.user_name(shm.owner_uid(path) or 0)}: "
                         "only they (or root) can drop it") from None
    return name


def drop_all(directory: str = shm.SHM_DIR) -> list[str]:
    """Unlink every cache segment of this user in `directory`; other users' are left alone
    (`foreign` lists them). Returns the names dropped."""
    dropped = []
    for name in shm.list_names(directory):
        if not _mine(directory, name):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            dropped.append(name)
        except FileNotFoundError:
            pass
    return dropped


def _removable(info: CacheInfo) -> bool:
    """Dead creator, or superseded; and no living process in the pid table."""
    return (info.stale or not info.creator_alive) and not info.attached


def removable(directory: str = shm.SHM_DIR) -> list[CacheInfo]:
    """This user's caches `cleanup` would remove now (creator dead or superseded, nothing attached)."""
    return [info for info in list_caches(directory) if _removable(info)]


def cleanup_half_built(directory: str = shm.SHM_DIR) -> list[Removed]:
    """Remove this user's half-built segments whose builder died (never published, never usable)."""
    return [Removed(HALF_BUILT, path) for path in (os.path.join(directory, n) for n in shm.stale_tmp_files(directory))
            if shm.unlink(path)]


def cleanup(directory: str = shm.SHM_DIR) -> list[Removed]:
    """Remove this user's cache segments that nothing is attached to and whose creator is dead or
    that are superseded (stale): warm caches a later job could still use, so only when asked
    (``coordl cleanup --caches``). Other users' segments are never touched (`foreign` lists them)."""
    removed = []
    for info in removable(directory):
        path = os.path.join(directory, info.name)
        try:
            fd = os.open(path, os.O_RDWR)
        except (FileNotFoundError, PermissionError):
            continue
        try:
            # holding byte 1 exclusively keeps new attachers waiting until the unlink is done
            again = _read(directory, info.name)  # attachers may have come before the lock
            if shm.nobody_attached(fd) and (info.stale or not again.creator_alive) and not again.attached:
                os.unlink(path)
                removed.append(Removed(CACHE, path))
        except (OSError, CacheError):
            continue  # gone meanwhile, or no longer a segment we can read: leave it
        finally:
            os.close(fd)
    return removed
