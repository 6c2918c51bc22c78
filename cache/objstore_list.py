"""How `cache/objstore.py` lists s3:// one request (one ListObjectsV2 page) at a time.

A page source is an async generator `source(after)` that yields, per LIST page (obstore: per chunk
of `objstore_obstore.LIST_CHUNK` objects), `([(key, size, etag), ...], [common prefix, ...])`
with keys relative to the bucket, starting after key `after` (S3's StartAfter) when given:
- `s3fs_pages`: ListObjectsV2 through s3fs's client (`_call_s3`: its error translation), one call
  per page, the continuation token between pages;
- `ObstoreGetter.list_pages` (objstore_obstore.py): obstore, parsed in Rust (the class prefixes;
  the root goes through s3fs).
`objstore.py` times each page out and retries it (`ObjectStore._list_pages`); a prefix listing
resumes after the last key received, so a retry re-sends one page, not the prefix.

`in_forked_child(work)`: run `work()` in a forked child and return its result. obstore's
runtime does not survive fork (objstore_obstore.py), so a process that has not started it lists
through obstore in a child and stays free to fork DataLoader workers that GET through obstore.
The answer crosses the pipe as msgpack of plain data (never a pickle): the result, or an error as
its coordl class name and message, raised again here as that class (another error: DatasetError).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import msgpack

from coordl import errors
from coordl.errors import DatasetError


def prefix_of(root: str, sub: str = "") -> tuple[str, str]:
    """(bucket, the key prefix ending in "/" or "" for the bucket's top) of root/sub."""
    bucket, _, key = f"{root}/{sub}".strip("/").partition("/")
    return bucket, f"{key}/" if key else ""


async def s3fs_pages(fs, bucket: str, prefix: str, delimiter: str | None, after: str | None):
    """ListObjectsV2 pages of bucket/prefix* through s3fs (see the module docstring)."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    if delimiter:
        kwargs["Delimiter"] = delimiter
    if after:
        kwargs["StartAfter"] = after
    while True:
        page = await fs._call_s3("list_objects_v2", **kwargs)
        yield ([(c["Key"], int(c["Size"]), unquote(c.get("ETag"))) for c in page.get("Contents", ())],
               [p["Prefix"][:-1] for p in page.get("CommonPrefixes", ())])
        if not page.get("IsTruncated"):
            return
        kwargs.pop("StartAfter", None)
        kwargs["ContinuationToken"] = page["NextContinuationToken"]


def unquote(etag: str | None) -> str | None:
    return str(etag).strip('"') if etag is not None else None


def in_forked_child(work: Callable[[], Any], what: str) -> Any:
    """work()'s result (plain data: lists, dicts, str, int, None), or its error raised here, computed
    in a forked child that answers through a pipe (msgpack) and leaves with os._exit. `what` names
    the work in the error when the child dies or fails with an error that is not coordl's."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child; its coverage is not collected)
        try:
            os.close(r)
            try:
                out: list = ["ok", work()]
            except BaseException as e:  # noqa: BLE001 (sent to the parent, raised there)
                out = ["error", type(e).__name__, str(e)]
            try:
                data = msgpack.packb(out, use_bin_type=True)
            except Exception as e:  # noqa: BLE001 (a result msgpack cannot carry: a bug, named)
                data = msgpack.packb(["error", "TypeError", f"the listing's result could not be sent ({e})"])
            with os.fdopen(w, "wb") as f:
                f.write(data)
        finally:
            os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            data = f.read()
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        _, status = os.waitpid(pid, 0)
    if not data:
        raise DatasetError(f"{what}: the listing process {pid} ended without an answer (wait status {status})")
    answer = msgpack.unpackb(data, raw=False)
    if answer[0] == "error":
        _, name, message = answer
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, errors.CoordlError):
            raise cls(message)
        raise DatasetError(f"{what}: {name}: {message}")
    return answer[1]
