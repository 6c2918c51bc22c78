"""The dataset fingerprint: what makes two trees the same dataset, and what does not.

The fingerprint names the dataset in every cache key, shared-memory segment
and Redis key, on this server and across servers (partitioned caching keys on
it). So it must differ whenever the data differs, and it must stay equal on
faithful copies of the tree on other servers or mount paths (``rsync -a``,
``tar c | tar x``, ``cp -a``, NFS), where only what a copy carries may count.

The exact rule (FORMAT 2):

    identity    = sha256("coordl-manifest-2", class names,
                         and per item: relative path, size, label,
                                       mtime in whole seconds (floor),
                         content digest)
    content     = sha256 over the SAMPLE_FILES items at evenly spaced
                  positions i = floor(j * n / k) of the sorted manifest
                  (every item when n <= SAMPLE_FILES) of
                  (i, the file's first and last SAMPLE_BYTES, or all of it
                  when it is smaller than 2 * SAMPLE_BYTES; an unreadable file
                  counts as the marker b"unreadable")
    revision    = "" on a tree never seen before; see below
    fingerprint = identity                       when revision is ""
                  sha256(identity, revision)     otherwise

Whole seconds, because tar keeps only those and some filesystems round
(a copy onto FAT, which keeps 2 s, does get a new fingerprint). Positions, not
a hash of each path, choose the sample, so choosing costs nothing per file and
is the same on every copy (the sorted manifest is). The sample costs k small
reads; `bench/scale.py` measures it (cold and warm) at 1.28M files.

What a sample cannot see is a change to the bytes of a file outside it that
keeps the file's size and whole-second mtime (a same-size edit followed by
``touch -d``/``os.utime``, or an edit within the second of the last write).
Copies carry no trace of such an edit, but the edited file does: its ctime
changes (no system call sets it back) and, when it is replaced rather than
rewritten, its inode. Those are local facts, so they are used locally only:

* the persisted manifest (coordl/manifest/store.py) records each file's
  (ctime_ns, st_ino); a full scan of a root that has a persisted manifest
  compares them, and every file whose size and whole-second mtime are unchanged
  but whose (mtime_ns, ctime_ns, st_ino) differ is a *silent revision*;
* the revision token becomes sha256(old token, each silently revised file's
  relative path, ctime_ns and inode) and is kept in the persisted manifest, so
  the fingerprint of this root moves away from every earlier one (and from
  other servers' copies, whose bytes it may no longer match) and stays moved.
  Removing the persisted manifest resets the token to "".

The fast restart check (manifest_store.py) stats the folders and the sampled
files only, so a silent revision of a file outside the sample is found by
the next full scan: `ImageFolder(..., rescan=True)`, or any added, removed or
renamed file, which rescans the whole root.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from coordl.manifest.threads import spread_all

FORMAT = 2
SAMPLE_FILES = 1024          # files whose bytes the identity covers
SAMPLE_BYTES = 64 * 1024     # from the head and the tail of each sampled file


def sample_positions(n: int, k: int | None = None) -> np.ndarray:
    """The sorted item positions whose bytes enter the fingerprint (k: SAMPLE_FILES)."""
    k = SAMPLE_FILES if k is None else k
    if n <= k:
        return np.arange(n, dtype=np.int64)
    return (np.arange(k, dtype=np.int64) * n) // k


def _file_sample(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= 2 * SAMPLE_BYTES:
                return f.read()
            head = f.read(SAMPLE_BYTES)
            f.seek(size - SAMPLE_BYTES)
            return head + f.read(SAMPLE_BYTES)
    except OSError:
        return b"unreadable"


def content_digest(paths: list[str], positions: np.ndarray, threads: int = 8) -> bytes:
    """sha256 of the sampled files' bytes (read by `threads` threads once the reads are seen
    waiting on storage: it pays when cold)."""
    h = hashlib.sha256()
    for pos, data in zip(positions.tolist(), spread_all(_file_sample, paths, threads, name="coordl-sample")):
        h.update(np.array([pos, len(data)], dtype=np.int64).tobytes())
        h.update(data)
    return h.digest()


def identity(classes: list[str] | tuple[str, ...], blob: np.ndarray, offsets: np.ndarray,
             sizes: np.ndarray, mtimes: np.ndarray, labels: np.ndarray, content: bytes) -> str:
    """The portable part of the fingerprint (see the module docstring)."""
    h = hashlib.sha256(f"coordl-manifest-{FORMAT}".encode())
    h.update("\0".join(classes).encode("utf-8", "surrogateescape"))
    h.update(np.asarray(offsets, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(blob).tobytes())
    h.update(np.asarray(sizes, dtype=np.int64).tobytes())
    h.update(np.asarray(labels, dtype=np.int64).tobytes())
    h.update(np.floor_divide(np.asarray(mtimes, dtype=np.int64), 1_000_000_000).tobytes())
    h.update(content)
    return h.hexdigest()


def next_revision(old: str, revised_rels: list[bytes], ctimes: np.ndarray, inodes: np.ndarray) -> str:
    """The revision token after a full scan found `revised_rels` silently revised."""
    if not revised_rels:
        return old
    h = hashlib.sha256(old.encode())
    for rel, c, i in zip(revised_rels, ctimes.tolist(), inodes.tolist()):
        h.update(rel + b"\0" + f"{c}:{i}".encode() + b"\0")
    return h.hexdigest()


def fingerprint(ident: str, revision: str) -> str:
    return ident if not revision else hashlib.sha256(f"{ident}:{revision}".encode()).hexdigest()
