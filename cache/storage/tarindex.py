"""Tar shards in WebDataset layout: an index of (shard, offset, size) per sample, and reads by pread.

A WebDataset shard is a plain tar whose members are grouped into samples by key: the member
name up to the first dot of its base name (``train/0001.jpg`` and ``train/0001.cls`` are the
sample ``train/0001``, extensions ``jpg`` and ``cls``; webdataset's ``base_plus_ext`` rule,
extensions compared in lower case). Members without a dot are ignored, as webdataset does.

`build_index` reads each shard's tar *headers* (Python's tarfile, which seeks over member
data) on a thread pool, one task per shard, and records per sample: the shard, the offset
and size of its image member (the first of ``image_ext``, in that order of preference), and
its label: the text of its ``label_ext`` member parsed as an int (those members are a few
bytes each and are read while indexing, so labels are an array and a batch needs no extra
read for them). Items are in shard order (as given), then in order of first appearance in
the shard.

What can be wrong, and where it shows (never a crash of the builder):

- a shard that tarfile cannot read past some point (a torn header, a truncated file, bytes
  that are not a tar): the samples indexed before that point are kept and the shard's
  ``damage`` says what and after which key; a member whose data lies past the end of the
  file fails when read (`read_many` returns a `SampleError` naming shard and key);
- a sample without an image member, without a label member, or with a label that is not an
  int: the item exists, and `image_state`/`label_state` say so; the dataset turns them into
  a `SampleError` naming shard and key when the item is used.

`read_many(items)` sorts a batch's items by (shard, offset) and reads each run of items of one
shard whose gaps are at most `max_gap` bytes (the label member and the next header lie between
two consecutive samples) with ONE pread; it returns the bytes per item and the number of reads
and bytes it made.

Shards in a bucket (`build_remote_index`, an ObjectStore and the shards' keys, sizes and ETags
from one listing): a shard of at most WHOLE_SHARD bytes (16 MiB) is read with ONE GET and its
headers walked in memory; a larger one through a seekable file whose reads are ranged GETs of at
least READ_AHEAD bytes (4 KiB) from the header asked for: the GET for a sample's label header
brings its label and the next sample's image header, so about one GET per sample, and little
image data besides (measured on 3 shards of 40 JPEGs of ~100 KiB: 46 GETs and 100 KB with 2 KiB;
43 GETs and 2.6 MB of the 4.3 MB with 64 KiB); shards on the thread pool, each walked in order. Reads are ranged
GETs (`ObjectStore.read_ranges`), one per run of a batch's neighbours, all of a batch at once.
Persisted keyed by the shards' (URL, size, ETag); the fingerprint hashes those and the index
(an ETag changes with the bytes, so no member bytes are read for it).

One snapshot: the index is what a loader serves, so the shards are checked against it. A local
shard is checked when this process opens it, and again at its first read of each epoch
(`begin_epoch`): the open file (fstat) and the file now at its path (stat) must have the size,
mtime_ns and inode it had when indexed, else its reads are a SampleError saying the shard changed
(a shard rewritten in place, or replaced by another file, is never read at the old offsets or
served with the old labels; the same at every num_workers). A shard in a bucket: each ranged GET
sends If-Match with the ETag listed (cache/storage/objstore.py).

Persisted like the manifest (coordl/manifest/store.py): one file per (shard paths,
extensions) in the folder the caller names, reused while every shard has the (size, mtime_ns,
ctime_ns, inode) it had when indexed; a flock makes one process build while the others of the
same moment wait and load its result; written under a temporary name and renamed (the index file
of cache/indexfile.py, magic MAGIC). A file that fails its checksums is rebuilt. `BUILDS` counts
builds and loads (tests).

The fingerprint covers what a faithful copy of the shards keeps (base names, sizes, whole-second
mtimes, every item's key, offset, size and label) and the first and last 4 KiB of up to
SAMPLE_ITEMS evenly spaced image members; it changes whenever a shard is rewritten.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import os
import re
import tarfile
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import numpy as np

from coordl.errors import SampleError

from .. import indexfile
from ..forkguard import ForkGuard

MAGIC = b"COORDLT2"  # T2: the index file of cache/indexfile.py (T1 files are rebuilt once)
SAMPLE_ITEMS = 64
SAMPLE_BYTES = 4096
WHOLE_SHARD = 16 << 20  # a shard in a bucket up to this size is indexed from one GET of all of it
READ_AHEAD = 4 << 10  # else: ranged GETs of this many bytes from each header (the next ones ride along)
MAX_GAP = 4096  # merge two items of one batch and shard when at most this many bytes lie between (neighbours)
BUILDS = {"builds": 0, "loads": 0}
_KEY = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_ARRAYS = ("shard", "offset", "size", "label", "image_state", "label_state", "key_off", "keys")
# image_state / label_state values
OK, MISSING, BAD = 0, 1, 2


@dataclasses.dataclass
class _Scan:
    keys: list[str]
    offset: list[int]
    size: list[int]
    label: list[int]
    image_state: list[int]
    label_state: list[int]
    damage: str | None


def _scan_shard(path: str, image_ext: Sequence[str], label_ext: str) -> _Scan:
    """One local shard's samples from its headers (and its label members' few bytes)."""
    try:
        file_size = os.stat(path).st_size
        with open(path, "rb") as f:
            return _scan_file(f, file_size, image_ext, label_ext)
    except OSError as e:
        return _Scan([], [], [], [], [], [], f"not a readable tar file ({e})")


def _scan_file(f: BinaryIO, file_size: int, image_ext: Sequence[str], label_ext: str) -> _Scan:
    """The samples of the tar in the seekable `f` of `file_size` bytes. A SampleError of a remote
    read is not caught here (the caller names the shard that could not be read)."""
    groups: dict[str, dict] = {}
    damage, last = None, None
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            try:
                for m in tar:
                    match = _KEY.match(m.name)
                    if not m.isfile() or match is None:
                        continue
                    key, ext = match.group(1), match.group(2).lower()
                    last = key
                    g = groups.setdefault(key, {})
                    if ext in image_ext and ext not in g:
                        g[ext] = (m.offset_data, m.size)
                    elif ext == label_ext and "label" not in g:
                        member = tar.extractfile(m) if m.offset_data + m.size <= file_size else None
                        g["label"] = member.read() if member is not None else None  # None: BAD
                end = tar.offset
            except (tarfile.TarError, OSError, EOFError) as e:
                damage, end = f"{e}" + (f" (after the sample {last!r})" if last else ""), None
            if damage is None and end is not None and end < file_size:
                f.seek(end)
                rest = f.read(min(file_size - end, 1 << 20))
                if rest.strip(b"\0") or file_size - end > 1 << 20:
                    damage = (f"bytes at offset {end} are not a tar header"
                              + (f" (after the sample {last!r})" if last else ""))
    except (tarfile.TarError, OSError, EOFError) as e:
        damage = f"not a readable tar file ({e})"
    scan = _Scan([], [], [], [], [], [], damage)
    for key, g in groups.items():
        img = next((g[e] for e in image_ext if e in g), None)
        scan.keys.append(key)
        scan.offset.append(img[0] if img else 0)
        scan.size.append(img[1] if img else 0)
        scan.image_state.append(OK if img else MISSING)
        raw = g.get("label", b"")
        try:
            label, state = (int(raw.decode("ascii").strip()), OK) if raw else (-1, MISSING if "label" not in g else BAD)
        except (ValueError, UnicodeDecodeError):
            label, state = -1, BAD
        scan.label.append(label)
        scan.label_state.append(state)
    return scan


def _stat(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class TarIndex:
    """The samples of a list of tar shards: per item, its shard, image offset and size, label."""

    def __init__(self, shards: list[str], damage: list[str | None], arrays: dict[str, np.ndarray],
                 fingerprint: str) -> None:
        self.shards, self.damage, self.fingerprint = shards, damage, fingerprint
        self.shard: np.ndarray = arrays["shard"]              # int32: the item's shard
        self.offset: np.ndarray = arrays["offset"]            # int64: its image member's data offset
        self.size: np.ndarray = arrays["size"]                # int64: ... and size
        self.label: np.ndarray = arrays["label"]              # int64: its label (-1 unless label_state OK)
        self.image_state: np.ndarray = arrays["image_state"]  # uint8: OK, MISSING
        self.label_state: np.ndarray = arrays["label_state"]  # uint8: OK, MISSING, BAD
        self.key_off: np.ndarray = arrays["key_off"]          # int64 (n + 1): key i is keys[key_off[i]:key_off[i+1]]
        self.keys: np.ndarray = arrays["keys"]                # uint8: the keys, UTF-8, end to end
        self._fds: dict[int, int] = {}  # shard -> its fd, opened by this process (self._fork)
        self._fork = ForkGuard()
        self.remote: tuple[Any, list[str]] | None = None  # (ObjectStore, shard keys) for shards in a bucket
        # per shard as indexed: local [size, mtime_ns, ctime_ns, inode]; in a bucket [size, ETag]
        self.stats: list[list] | None = None
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._checked: set[int] = set()  # shards whose open fd was checked in this epoch (this process)

    def __len__(self) -> int:
        return len(self.shard)

    @property
    def total_bytes(self) -> int:
        return int(self.size.sum())

    def key(self, i: int) -> str:
        return bytes(self.keys[self.key_off[i]:self.key_off[i + 1]]).decode("utf-8", "surrogateescape")

    def where(self, i: int) -> str:
        """'<shard path>: sample <key>', for messages."""
        return f"{self.shards[int(self.shard[i])]}: sample {self.key(i)!r}"

    def begin_epoch(self, epoch: int) -> None:
        """A new epoch in this process: each local shard is checked again at its next read."""
        with self._lock:
            if epoch != self._epoch:
                self._epoch, self._checked = epoch, set()

    def _fd(self, s: int) -> int:
        """Shard s's open fd in this process, checked against the index at open and at its first
        read of each epoch (`_check`): raises SampleError when the shard changed."""
        with self._lock:
            if self._fork.forked():  # inherited through fork: this process opens its own
                self._fds, self._checked = {}, set()
                self._fork.reset()
            fds = self._fds
            if s not in fds:
                fds[s] = os.open(self.shards[s], os.O_RDONLY)
            if s not in self._checked:
                self._check(s, fds[s])
                self._checked.add(s)
            return fds[s]

    def _check(self, s: int, fd: int) -> None:
        """SampleError unless the open shard and the file at its path are the one indexed (size,
        mtime_ns, inode): one fstat and one stat."""
        if self.stats is None:
            return
        size, mtime_ns, _, inode = self.stats[s]
        for where, st in (("the open file", os.fstat(fd)), ("the file at its path", os.stat(self.shards[s]))):
            now = (st.st_size, st.st_mtime_ns, st.st_ino)
            if now != (size, mtime_ns, inode):
                raise SampleError(f"changed since it was indexed ({where} has size {now[0]}, mtime_ns {now[1]}, "
                                  f"inode {now[2]}; indexed: {size}, {mtime_ns}, {inode}): a loader serves the "
                                  "shards as indexed when the WebDataset was built; build it again to read the "
                                  "new contents, or pass on_error='skip'")

    def close(self) -> None:
        with self._lock:
            if self._fork.owner():
                for fd in self._fds.values():
                    os.close(fd)
            self._fds = {}
            self._fork.reset()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _fetch(self, spans: list[tuple[int, int, int]], drop_page_cache: bool,
               on_attempts: Callable[[int], None] | None = None) -> list[bytes | SampleError]:
        """The bytes of each (shard, offset, length): one pread each, or for shards in a bucket one
        ranged GET each, all at once (ObjectStore.read_ranges, which calls `on_attempts(n)` with each
        GET's requests). A failure is a SampleError whose text says why and what to do (the caller
        prefixes the shard and key)."""
        if self.remote is not None:
            store, keys = self.remote
            etags = None if self.stats is None else [self.stats[s][1] for s, _, _ in spans]
            got = store.read_ranges([(keys[s], off, n) for s, off, n in spans], return_errors=True,
                                    on_attempts=on_attempts, etags=etags)
            out: list[bytes | SampleError] = []
            for (s, _, _), g in zip(spans, got):
                if isinstance(g, SampleError):  # its text starts with the shard's URL: said once
                    text = str(g)
                    url = self.shards[s] + ": "
                    g = SampleError(text[len(url):] if text.startswith(url) else text)
                out.append(g)
            return out
        out = []
        for s, start, n in spans:
            try:
                fd = self._fd(s)
                buf = os.pread(fd, n, start)
                if drop_page_cache:
                    os.posix_fadvise(fd, start, n, os.POSIX_FADV_DONTNEED)
            except OSError as e:
                out.append(SampleError(f"cannot read the shard ({e.strerror or e}): check that it exists "
                                       "and is readable, or pass on_error='skip'"))
                continue
            except SampleError as e:  # the shard changed since it was indexed (_check)
                out.append(e)
                continue
            out.append(buf)
        return out

    def read(self, i: int, drop_page_cache: bool = False) -> bytes:
        """Item i's image bytes (one pread); raises SampleError naming shard and key."""
        data, errors, _, _ = self.read_many([i], drop_page_cache)
        if i in errors:
            raise errors[i]
        return data[i]

    def read_many(self, items: Sequence[int], drop_page_cache: bool = False, max_gap: int = MAX_GAP,
                  on_attempts: Callable[[int], None] | None = None
                  ) -> tuple[dict[int, bytes], dict[int, SampleError], int, int]:
        """(bytes per item, SampleError per item that failed, preads made, bytes read).

        Items of one shard whose image members lie at most `max_gap` bytes apart are read with
        one pread; an item without an image member costs no read. For shards in a bucket,
        `on_attempts(n)` is called before this returns with each ranged GET's requests (1 + its
        retries; ObjectStore.read_ranges); local shards never call it."""
        data: dict[int, bytes] = {}
        errors: dict[int, SampleError] = {}
        todo = []
        for i in dict.fromkeys(int(i) for i in items):
            if self.image_state[i] != OK:
                errors[i] = SampleError(f"{self.where(i)} has no image member: add it to the shard, "
                                        "or pass on_error='skip'")
            else:
                todo.append((int(self.shard[i]), int(self.offset[i]), i))
        todo.sort()
        runs: list[list[tuple[int, int, int]]] = []  # items of one shard read by one request
        k = 0
        while k < len(todo):
            s, start, _ = todo[k]
            run = [todo[k]]
            end = start + int(self.size[todo[k][2]])
            while k + len(run) < len(todo):
                s2, off2, i2 = todo[k + len(run)]
                if s2 != s or off2 - end > max_gap:
                    break
                run.append(todo[k + len(run)])
                end = max(end, off2 + int(self.size[i2]))
            k += len(run)
            runs.append(run)
        spans = [(run[0][0], run[0][1], max(off + int(self.size[i]) for _, off, i in run) - run[0][1]) for run in runs]
        reads = nbytes = 0
        for run, got in zip(runs, self._fetch(spans, drop_page_cache, on_attempts)):
            if isinstance(got, SampleError):
                for _, _, i in run:
                    errors[i] = SampleError(f"{self.where(i)}: {got}")
                continue
            buf = got
            start = run[0][1]
            reads += 1
            nbytes += len(buf)
            view = memoryview(buf)
            for _, off, i in run:
                piece = view[off - start: off - start + int(self.size[i])]
                if len(piece) != int(self.size[i]):
                    errors[i] = SampleError(f"{self.where(i)}: the shard ends inside the image member "
                                            f"({len(piece)} of {int(self.size[i])} bytes): the shard is "
                                            "truncated; rewrite it, or pass on_error='skip'")
                else:
                    data[i] = bytes(piece) if len(run) > 1 else buf
        return data, errors, reads, nbytes


# -- building, persisting, loading --

def _fingerprint(shards: list[str], stats: list[list], exts: list, arrays: dict[str, np.ndarray],
                 remote: bool = False) -> str:
    """Local shards: names, sizes, whole-second mtimes, the index and sampled bytes. Shards in a
    bucket: names, sizes and ETags (an ETag changes with the object's bytes) and the index."""
    h = hashlib.sha256(b"coordl-tarindex-1")
    rows = ([[os.path.basename(p), st[0], st[1]] for p, st in zip(shards, stats)] if remote else
            [[os.path.basename(p), st[0], st[1] // 10**9] for p, st in zip(shards, stats)])
    h.update(json.dumps([exts, rows]).encode("utf-8", "surrogateescape"))
    for name in ("shard", "offset", "size", "label", "key_off", "keys"):
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    if remote:
        return h.hexdigest()
    n = len(arrays["shard"])
    picks = sorted({j * n // SAMPLE_ITEMS for j in range(min(n, SAMPLE_ITEMS))})
    for i in picks:
        if arrays["image_state"][i] != OK:
            continue
        s, off, size = int(arrays["shard"][i]), int(arrays["offset"][i]), int(arrays["size"][i])
        try:
            with open(shards[s], "rb") as f:
                if size <= 2 * SAMPLE_BYTES:
                    f.seek(off)
                    part = f.read(size)
                else:
                    f.seek(off)
                    part = f.read(SAMPLE_BYTES)
                    f.seek(off + size - SAMPLE_BYTES)
                    part += f.read(SAMPLE_BYTES)
        except OSError:
            part = b"unreadable"
        h.update(i.to_bytes(8, "little") + part)
    return h.hexdigest()


def _build(shards: list[str], image_ext: tuple, label_ext: str, threads: int) -> tuple[list, dict]:
    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(shards))), "coordl-tarindex") as pool:
        scans = list(pool.map(lambda p: _scan_shard(p, image_ext, label_ext), shards))
    return _arrays(scans)


def _arrays(scans: list[_Scan]) -> tuple[list, dict]:
    keys = [k.encode("utf-8", "surrogateescape") for sc in scans for k in sc.keys]
    arrays = {
        "shard": np.concatenate([np.full(len(sc.keys), s, np.int32) for s, sc in enumerate(scans)] or
                                [np.zeros(0, np.int32)]),
        "offset": np.array([v for sc in scans for v in sc.offset], np.int64),
        "size": np.array([v for sc in scans for v in sc.size], np.int64),
        "label": np.array([v for sc in scans for v in sc.label], np.int64),
        "image_state": np.array([v for sc in scans for v in sc.image_state], np.uint8),
        "label_state": np.array([v for sc in scans for v in sc.label_state], np.uint8),
        "key_off": np.concatenate([[0], np.cumsum([len(k) for k in keys], dtype=np.int64)]).astype(np.int64),
        "keys": np.frombuffer(b"".join(keys), np.uint8).copy(),
    }
    return [sc.damage for sc in scans], arrays


def _save(path: str, header: dict, arrays: dict[str, np.ndarray]) -> None:
    indexfile.save(path, MAGIC, header, {name: arrays[name] for name in _ARRAYS})


def _load(path: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """The header and arrays of a persisted index, or None if missing, foreign or damaged."""
    header, _ = indexfile.load_header(path, MAGIC)
    arrays = None if header is None else indexfile.read_arrays(path, header)
    return None if header is None or arrays is None else (header, arrays)


def build_index(shards: Sequence[str], image_ext: Sequence[str] = ("jpg", "jpeg", "png", "webp"),
                label_ext: str = "cls", folder: str | None = None, threads: int = 16,
                rebuild: bool = False) -> TarIndex:
    """The index of `shards` (local paths), loaded from `folder` when every shard is unchanged,
    else built (headers on a thread pool) and saved there. `folder=None`: built, not saved.

    Raises OSError (naming the shard) when a shard cannot be stat'ed: a missing shard is a
    configuration error for the caller to report."""
    shards = [os.path.abspath(os.fspath(p)) for p in shards]
    image_ext = tuple(e.lower().lstrip(".") for e in image_ext)
    label_ext = label_ext.lower().lstrip(".")
    stats = [_stat(p) for p in shards]
    exts = [list(image_ext), label_ext]

    def fresh() -> TarIndex:
        return _fresh(shards, stats, exts, threads)

    return _cached(folder, shards, stats, exts, rebuild, fresh, None)


def _cached(folder: str | None, shards: list[str], stats: list, exts: list, rebuild: bool,
            fresh: Callable[[], TarIndex], remote: tuple[Any, list[str]] | None) -> TarIndex:
    """The persisted index of (shards, exts) in `folder` if its stats match, else fresh() saved there."""
    if folder is None:
        index = fresh()
    else:
        name = hashlib.sha256(json.dumps([shards, exts]).encode("utf-8", "surrogateescape")).hexdigest()[:32]
        path = os.path.join(folder, name + ".tarindex")
        os.makedirs(folder, exist_ok=True)
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_EX)
            loaded = None if rebuild else _load(path)
            if loaded is not None and loaded[0].get("stats") == stats and loaded[0].get("exts") == exts:
                header, arrays = loaded
                BUILDS["loads"] += 1
                index = TarIndex(shards, header["damage"], arrays, header["fingerprint"])
            else:
                index = fresh()
                arrays = {n: getattr(index, n) for n in _ARRAYS}
                _save(path, {"shards": shards, "stats": stats, "exts": exts, "damage": index.damage,
                             "fingerprint": index.fingerprint}, arrays)
        finally:
            os.close(lock)
    index.remote, index.stats = remote, stats
    return index


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over one object, read by ranged GETs of at least `block` bytes
    from the position asked for (what tarfile needs to walk a shard's headers)."""

    def __init__(self, store: Any, key: str, size: int, block: int) -> None:
        self.store, self.key, self.size, self.block = store, key, size, block
        self.pos, self.buf_start, self.buf = 0, 0, b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), max(0, self.size - self.pos))
        if n == 0:
            return 0
        if not (self.buf_start <= self.pos and self.pos + n <= self.buf_start + len(self.buf)):
            length = min(max(n, self.block), self.size - self.pos)
            self.buf = self.store.read_ranges([(self.key, self.pos, length)])[0]
            self.buf_start = self.pos
        piece = self.buf[self.pos - self.buf_start:self.pos - self.buf_start + n]
        b[:len(piece)] = piece
        self.pos += len(piece)
        return len(piece)


def _scan_object(store: Any, key: str, size: int, image_ext: tuple, label_ext: str) -> _Scan:
    if size <= WHOLE_SHARD:  # one GET for the whole shard, scanned in memory
        return _scan_file(io.BytesIO(store.read_ranges([(key, 0, size)])[0]), size, image_ext, label_ext)
    return _scan_file(io.BufferedReader(_RangeFile(store, key, size, READ_AHEAD), 512), size, image_ext, label_ext)


def build_remote_index(store: Any, keys: Sequence[str], infos: Sequence[tuple[int, str | None]],
                       image_ext: Sequence[str] = ("jpg", "jpeg", "png", "webp"), label_ext: str = "cls",
                       folder: str | None = None, threads: int = 16, rebuild: bool = False) -> TarIndex:
    """The index of the shards `keys` (relative to `store`'s root, an ObjectStore) whose listed
    (size, ETag) are `infos`: loaded from `folder` while every shard's URL, size and ETag are
    unchanged, else built (a shard up to WHOLE_SHARD bytes with one GET, a larger one with ranged
    GETs of READ_AHEAD bytes from each header; shards on a thread pool) and saved there. Reads go
    through `store.read_ranges`. Raises SampleError naming the shard's URL if a GET fails. A store
    that gives no ETag (memory://, some gateways): built at every start, never persisted."""
    keys = list(keys)
    names = [store.url_of(k) for k in keys]
    image_ext = tuple(e.lower().lstrip(".") for e in image_ext)
    label_ext = label_ext.lower().lstrip(".")
    stats = [[int(size), etag] for size, etag in infos]
    exts = [list(image_ext), label_ext]

    def fresh() -> TarIndex:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(keys))), "coordl-tarindex") as pool:
            scans = list(pool.map(lambda ks: _scan_object(store, ks[0], ks[1][0], image_ext, label_ext),
                                  zip(keys, stats)))
        damage, arrays = _arrays(scans)
        BUILDS["builds"] += 1
        return TarIndex(names, damage, arrays, _fingerprint(names, stats, exts, arrays, remote=True))

    if any(etag is None for _, etag in stats):  # a store without ETags: a size alone cannot tell a rewrite
        folder = None
    return _cached(folder, names, stats, exts, rebuild, fresh, (store, keys))


def _fresh(shards: list[str], stats: list[list[int]], exts: list, threads: int) -> TarIndex:
    damage, arrays = _build(shards, tuple(exts[0]), exts[1], threads)
    BUILDS["builds"] += 1
    return TarIndex(shards, damage, arrays, _fingerprint(shards, stats, exts, arrays))
