"""The one atomic index file: a JSON header under a checksum, then numpy arrays under theirs.

    save(path, MAGIC, header, arrays)          # written under a temporary name, renamed over `path`
    header, why = load_header(path, MAGIC)     # (None, "") missing or foreign; (None, why) damaged
    arrays = read_arrays(path, header)         # None when an array fails its checksum (torn)

Used by the tar index (storage/tarindex.py) and the manifest store (coordl/manifest/store.py), each
with its own magic: a change of what a file holds is a new magic, so an old file reads as foreign
and is rebuilt once.

Layout: MAGIC (8 bytes), the header's length (8, little-endian), the xxh3_64 of the header (8),
the header (ASCII JSON: the caller's keys, plus ``arrays`` {name: [offset, dtype, count, xxh3_64]},
``body`` and ``total``, the file's size), zero padding to ``body``, the arrays (each 8-byte
aligned, at ``body`` + its offset). A reader sees the old file or the new one, never a torn one:
the file is renamed into place, and a file cut short or changed is caught by its size and checksums.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable

import numpy as np
import xxhash

PREFIX = 24  # MAGIC, header length, header xxh3_64


def save(path: str, magic: bytes, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write `header` and `arrays` to `path`: under a temporary name in its folder, then renamed."""
    table, off, chunks = {}, 0, []
    for name, arr in arrays.items():
        data = np.ascontiguousarray(arr).tobytes()
        table[name] = [off, arr.dtype.str, int(arr.size), xxhash.xxh3_64_hexdigest(data)]
        pad = -len(data) % 8
        chunks += [data, b"\0" * pad]
        off += len(data) + pad
    header = {**header, "arrays": table}
    body = PREFIX + len(json.dumps(header, ensure_ascii=True)) + 64
    body += -body % 8
    while True:  # the header holds the body's offset and the file's size: grow until they fit
        header["body"], header["total"] = body, body + off
        text = json.dumps(header, ensure_ascii=True).encode()
        if PREFIX + len(text) <= body:
            break
        body += 8
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(magic + len(text).to_bytes(8, "little") + xxhash.xxh3_64_intdigest(text).to_bytes(8, "little")
                    + text)
            f.write(b"\0" * (body - PREFIX - len(text)))
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_header(path: str, magic: bytes, fmt: object = None) -> tuple[dict | None, str]:
    """(the header of the file at `path`, "") or (None, why it is damaged); (None, "") if the file
    is missing, unreadable or foreign (another magic, or with `fmt` another header ``format``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(PREFIX)
            if len(head) < 8 or head[:8] != magic:
                return None, ""
            n = int.from_bytes(head[8:16], "little")
            text = f.read(n) if len(head) == PREFIX and n <= os.fstat(f.fileno()).st_size else b""
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None, ""
    if len(text) != n or len(head) != PREFIX or xxhash.xxh3_64_intdigest(text) != int.from_bytes(
            head[16:24], "little"):
        return None, "its header fails its checksum"
    try:
        header = json.loads(text)
    except ValueError:
        return None, "its header is not JSON"
    if not isinstance(header, dict) or (fmt is not None and header.get("format") != fmt):
        return None, ""
    if header.get("total") != size:
        return None, f"{size} bytes where its header records {header.get('total')!r}"
    return header, ""


def read_arrays(path: str, header: dict, names: Iterable[str] | None = None) -> dict[str, np.ndarray] | None:
    """The arrays of the file (those of `names`, default all) as its header lists them, or None if
    one fails its checksum or the file cannot be read (torn, replaced, removed)."""
    wanted = None if names is None else set(names)
    out = {}
    try:
        with open(path, "rb") as f:
            for name, (off, dtype, count, digest) in header["arrays"].items():
                if wanted is not None and name not in wanted:
                    continue
                f.seek(header["body"] + off)
                nbytes = count * np.dtype(dtype).itemsize
                data = f.read(nbytes)
                if len(data) != nbytes or xxhash.xxh3_64_hexdigest(data) != digest:
                    return None
                out[name] = np.frombuffer(data, dtype=dtype)
    except (OSError, KeyError, ValueError, TypeError):
        return None
    return out
