"""Inspect, drop and clean up MinIO cache segments on this node (`coordl cache ...`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from coordl.errors import CacheError

from . import shm
from .layout import Segment


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


def _read(directory: str, name: str) -> CacheInfo:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDONLY)
    seg = Segment(fd, path, writable=False, whole=False)
    try:
        return CacheInfo(
            name, seg.fingerprint, seg.field("label").decode("utf-8", "replace"), seg.capacity,
            seg.used, seg.cached_bytes(), seg.cached_items(), seg.n_items,
            int(seg.field("creator_pid")), seg.creator_alive(), tuple(seg.attached()))
    finally:
        seg.close()


def list_caches(directory: str = shm.DEFAULT_DIR) -> list[CacheInfo]:
    """Every readable cache segment in `directory` (unreadable ones are skipped)."""
    out = []
    for name in shm.list_names(directory):
        try:
            out.append(_read(directory, name))
        except (OSError, CacheError):
            continue
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
    os.unlink(os.path.join(directory, name))
    return name


def drop_all(directory: str = shm.DEFAULT_DIR) -> list[str]:
    names = shm.list_names(directory)
    for name in names:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    return names


def cleanup(directory: str = shm.DEFAULT_DIR) -> list[str]:
    """Remove segments whose creator is dead and that no process is attached to,
    and half-built segments whose builder died. Returns the names removed."""
    removed = []
    for name in shm.stale_tmp_files(directory):
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    for name in shm.list_names(directory):
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            info = _read(directory, name)
            # holding byte 1 exclusively keeps new attachers waiting until the unlink is done
            if not info.creator_alive and not info.attached and shm.nobody_attached(fd):
                os.unlink(path)
                removed.append(name)
        except CacheError:
            continue  # not a segment we can read: leave it to `coordl cache drop`
        finally:
            os.close(fd)
    return removed
