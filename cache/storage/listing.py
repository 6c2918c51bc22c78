"""How `objstore.py` lists s3:// one request (one ListObjectsV2 page) at a time.

A page source is an async generator `source(after)` that yields, per LIST page (obstore: per chunk
of `obstoreget.LIST_CHUNK` objects), `([(key, size, etag), ...], [common prefix, ...])`
with keys relative to the bucket, starting after key `after` (S3's StartAfter) when given:
- `s3fs_pages`: ListObjectsV2 through s3fs's client (`_call_s3`: its error translation), one call
  per page, the continuation token between pages;
- `ObstoreGetter.list_pages` (obstoreget.py): obstore, parsed in Rust (the class prefixes;
  the root goes through s3fs);
- `falling_back(first, then)`: first's pages until it meets a key it cannot name (obstore: an
  empty, '.' or '..' segment, `KeyNotNamable`), then the rest of the prefix from then's, after the
  last key received: both clients list the same keys (`a//b.jpg` included).
`objstore.py` times each page out and retries it (`ObjectStore._list_pages`); a prefix listing
resumes after the last key received, so a retry re-sends one page, not the prefix.

`in_forked_child(work)`: run `work()` in a forked child and return its result. obstore's
runtime does not survive fork (obstoreget.py), so a process that has not started it lists
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

from .policy import KeyNotNamable, ObjectChanged


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


def falling_back(first: Callable, then: Callable) -> Callable:
    """A page source: first(after)'s pages; from a KeyNotNamable on, then(after the last key received)'s."""

    async def pages(after: str | None):
        source = first(after)
        try:
            while True:
                try:
                    page = await source.__anext__()
                except StopAsyncIteration:
                    return
                except KeyNotNamable:
                    break
                if page[0]:
                    after = page[0][-1][0]
                yield page
        finally:
            await source.aclose()
        rest = then(after)
        try:
            async for page in rest:
                yield page
        finally:
            await rest.aclose()

    return pages


async def s3fs_get(fs, path: str, start: int | None, end: int | None, etag: str) -> bytes:
    """The bytes of bucket/key `path` (or [start, end) of them) through s3fs's client, with If-Match
    the listed `etag` (unquoted): ObjectChanged when the store answers 412 (another ETag now)."""
    bucket, key, _ = fs.split_path(path)
    kwargs = {"IfMatch": f'"{etag}"'}
    if start is not None and end is not None:
        kwargs["Range"] = f"bytes={start}-{end - 1}"
    failed = None
    try:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kwargs)
    except OSError as e:
        status = getattr(e.__cause__, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 412:
            raise
        failed = ObjectChanged("HTTP 412 Precondition Failed: its ETag is no longer the listed one")
    if failed is not None:
        raise failed
    try:
        return await response["Body"].read()
    finally:
        response["Body"].close()


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


def select_images(infos: list, classes: list[str], exts: tuple[str, ...]) -> tuple[list, list[int]]:
    """The objects (ObjectInfo) of `infos` below a class prefix of `classes` whose key ends in one of
    `exts` (lower case), walk order kept, and how many in each class."""
    counts = dict.fromkeys(classes, 0)
    kept = []
    for o in infos:
        cls, sep, rest = o.key.partition("/")
        if sep and cls in counts and rest.lower().endswith(exts):
            kept.append(o)
            counts[cls] += 1
    return kept, [counts[c] for c in classes]
