"""An S3 endpoint for benches that costs the client's machine about what a remote store costs it.

    index = build_index(server.client(), "bench", "train", root)      # from moto's listing of root
    proxy = StaticProxyProcess(server.url, index, latency=0.020).start() # proxy.url to clients
    proxy.counts["GET"], proxy.routes["static"], proxy.pid, proxy.stop()
    lister = StaticProxyProcess(None, {}, latency=0.020, listing=(1_281_000, 1000)).start()  # no moto


bench/lib/objstore_proxy.FaultProxy forwards every request to moto (pure Python: 1-2 ms of CPU per
GET, on the cores the loaders being measured use). This proxy answers the object reads itself from
the folder moto was filled from, and forwards the rest to moto:

- emulated: every request waits `latency` seconds before it is answered (one round trip), and every
  response body is paced at `bandwidth` bytes/s per connection (if given), on both routes;
- `static` route: GetObject (whole or one `Range: bytes=a-b | a- | -n`, 206 with Content-Range; 416
  InvalidRange past the end) and HeadObject of the objects in the index, answered from the file with
  the ETag, Last-Modified and Size of moto's own listing, Content-Type binary/octet-stream,
  Accept-Ranges, and x-amz-checksum-crc32 on a whole GET that asks for checksums (what moto sends);
  If-Match is honoured (412 PreconditionFailed);
- `listing` route (with `listing=(n, classes)`): ListObjectsV2, HeadBucket and HeadObject of a
  synthetic bucket `bench` of n objects under train/<class>/ answered from memory
  (bench/lib/objstore_listing.py, built in the proxy's process), so a listing of 1,281,000
  objects costs the store ~3.5 ms of CPU per 1000-key page instead of moto's 143+; with upstream None
  there is no moto and anything else is answered 501 NotImplemented;
- `moto` route: everything else (ListObjectsV2, bucket requests, PUTs, other conditional headers,
  keys not in the index, any query parameter but x-id) goes to moto unchanged (Host included, so
  SigV4 signatures hold) and its answer comes back unchanged;
- not emulated: the static route checks no signature (moto without enable_auth checks none either),
  serves no versions, SSE or multipart parts, and an object written after the index was built keeps
  its old bytes there: build the index after the upload.

One asyncio event loop in one process (`StaticProxyProcess` runs this file as a script, like
objstore_proxy.ProxyProcess), so its CPU time is measured apart from the client's. Not part of the
library: coordl never imports it.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import email.utils
import hashlib
import json
import os
import sys
import tempfile
import urllib.parse
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from lib.objstore_listing import SyntheticBucket  # noqa: E402
from lib.objstore_proxy import ProxyProcess  # noqa: E402

_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"proxy-connection", b"te", b"trailer", b"upgrade",
        b"content-length"}
_FORWARD_IF = {b"if-none-match", b"if-modified-since", b"if-unmodified-since"}  # moto decides these
_REASONS = {200: "OK", 206: "Partial Content", 404: "Not Found", 412: "Precondition Failed",
            416: "Requested Range Not Satisfiable", 501: "Not Implemented"}
_STEP = 64 * 1024


def build_index(client, bucket: str, prefix: str, root: str) -> dict[str, dict]:
    """{"/bucket/prefix/rel": {path, size, etag, last_modified, crc32}} for every object moto lists under
    prefix/, each the file root/rel it was uploaded from (its size and MD5 checked against the
    listing's Size and ETag, so the static route serves what moto would)."""
    index = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.strip("/") + "/")
    for obj in (o for page in pages for o in page.get("Contents", [])):
        path = os.path.join(root, obj["Key"][len(prefix.strip("/")) + 1:])
        with open(path, "rb") as f:
            data = f.read()
        etag = obj["ETag"]
        if len(data) != obj["Size"] or f'"{hashlib.md5(data).hexdigest()}"' != etag:
            raise RuntimeError(f"{path} differs from s3://{bucket}/{obj['Key']} ({len(data)} bytes, ETag {etag}): "
                               "build the index after uploading the folder")
        index[urllib.parse.quote(f"/{bucket}/{obj['Key']}")] = {
            "path": path, "size": len(data), "etag": etag,
            "last_modified": email.utils.format_datetime(obj["LastModified"].astimezone(datetime.timezone.utc),
                                                         usegmt=True),
            "crc32": base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()}
    return index


def _range(spec: str, size: int) -> tuple[int, int] | None:
    """(first, last) bytes of `bytes=a-b | a- | -n` in an object of `size`; None if unsatisfiable."""
    first, _, last = spec.strip().removeprefix("bytes=").partition("-")
    if not first:
        n = int(last)
        return (max(0, size - n), size - 1) if n > 0 and size else None
    a = int(first)
    b = min(int(last), size - 1) if last else size - 1
    return (a, b) if a < size and a <= b else None


def _error(code: str, message: str, **extra: str) -> bytes:
    fields = "".join(f"<{k}>{v}</{k}>" for k, v in extra.items())
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"{fields}</Error>").encode()


async def _read_body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> bytes | None:
    """The body after `headers` (Content-Length or chunked); None: no length given."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        parts = []
        while True:
            n = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if n == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(n))
            await reader.readexactly(2)
    if b"content-length" in headers:
        return await reader.readexactly(int(headers[b"content-length"]))
    return None


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, list[tuple[bytes, bytes]], dict[bytes, bytes]]:
    """(first line, [(name, value)] as sent, {lowercase name: value})."""
    lines = (await reader.readuntil(b"\r\n\r\n"))[:-4].split(b"\r\n")
    raw = [(k, v.strip()) for k, _, v in (line.partition(b":") for line in lines[1:])]
    return lines[0], raw, {k.lower(): v for k, v in raw}


class StaticProxy:
    """See the module docstring. Runs on the calling thread's event loop (`serve`)."""

    def __init__(self, upstream: str | None, index: dict[str, dict], latency: float = 0.020,
                 bandwidth: float | None = None, listing: SyntheticBucket | None = None) -> None:
        parsed = urllib.parse.urlsplit(upstream or "")
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80) if upstream else None
        self.index, self.latency, self.bandwidth, self.listing = index, latency, bandwidth, listing
        self.counts: dict[str, int] = {}
        self.routes = {"static": 0, "moto": 0, "listing": 0}
        self.in_flight = self.max_in_flight = 0
        self._request_id = 0

    def state(self) -> dict:
        return {"counts": self.counts, "routes": self.routes, "max_in_flight": self.max_in_flight}

    def reset_counts(self) -> None:
        self.counts, self.routes = {}, {"static": 0, "moto": 0, "listing": 0}
        self.max_in_flight = self.in_flight

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._client, "127.0.0.1", 0)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: list = []  # [(reader, writer)] to moto while it keeps the connection open
        try:
            while True:
                try:
                    first, raw, headers = await _read_head(reader)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                method, target, _ = first.decode("latin-1").split(" ", 2)
                body = await _read_body(reader, headers) or b""
                if target.startswith("/__proxy__/"):
                    if target == "/__proxy__/reset":
                        self.reset_counts()
                    await self._send(writer, 200, "OK", [(b"Content-Type", b"application/json")],
                                     json.dumps(self.state()).encode())
                    continue
                self.counts[method] = self.counts.get(method, 0) + 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    if self.latency:
                        await asyncio.sleep(self.latency)
                    listed = self.listing.answer(method, target) if self.listing is not None else None
                    entry = self._static(method, target, headers) if listed is None else None
                    if listed is not None:
                        self.routes["listing"] += 1
                        status, head, data = listed
                        length = next((int(v) for k, v in head if k == b"Content-Length"), None)
                        await self._send(writer, status, _REASONS.get(status, "Not Found"),
                                         [(k, v) for k, v in head if k != b"Content-Length"], data, length=length)
                    elif entry is not None:
                        self.routes["static"] += 1
                        await self._answer(writer, method, entry, headers)
                    else:
                        self.routes["moto"] += 1
                        if not await self._forward(writer, upstream, first, raw, body, method):
                            return
                finally:
                    self.in_flight -= 1
                if headers.get(b"connection", b"").lower() == b"close":
                    return
        except (ConnectionError, asyncio.CancelledError):  # gone, or this process is stopping
            return
        finally:
            for _, w in upstream:
                w.close()
            writer.close()

    def _static(self, method: str, target: str, headers: dict[bytes, bytes]) -> dict | None:
        if method not in ("GET", "HEAD") or _FORWARD_IF & headers.keys():
            return None
        path, _, query = target.partition("?")
        if query and any(not p.startswith("x-id=") for p in query.split("&")):
            return None
        return self.index.get(path)

    async def _answer(self, writer: asyncio.StreamWriter, method: str, entry: dict,
                      headers: dict[bytes, bytes]) -> None:
        size, etag = entry["size"], entry["etag"]
        common = [(b"ETag", etag.encode()), (b"Last-Modified", entry["last_modified"].encode()),
                  (b"Accept-Ranges", b"bytes")]
        if_match = headers.get(b"if-match")
        if if_match is not None and if_match.decode() not in (etag, "*"):
            await self._send(writer, 412, _REASONS[412], [(b"Content-Type", b"application/xml")],
                             _error("PreconditionFailed", "At least one of the pre-conditions you specified did "
                                    "not hold", Condition="If-Match"))
            return
        first, last, status, extra = 0, size - 1, 200, []
        if b"range" in headers and method == "GET":
            spec = headers[b"range"].decode()
            got = _range(spec, size)
            if got is None:
                await self._send(writer, 416, _REASONS[416], [(b"Content-Type", b"application/xml")],
                                 _error("InvalidRange", "The requested range is not satisfiable",
                                        ActualObjectSize=str(size), RangeRequested=spec))
                return
            (first, last), status = got, 206
            extra.append((b"Content-Range", f"bytes {first}-{last}/{size}".encode()))
        elif method == "GET" and headers.get(b"x-amz-checksum-mode", b"").lower() == b"enabled":
            extra.append((b"x-amz-checksum-crc32", entry["crc32"].encode()))
        head = [(b"Content-Type", b"binary/octet-stream"), *common, *extra]
        if method == "HEAD":
            await self._send(writer, 200, "OK", head, b"", length=size)
            return
        with open(entry["path"], "rb") as f:
            f.seek(first)
            data = f.read(last - first + 1)
        await self._send(writer, status, _REASONS[status], head, data)

    async def _forward(self, writer: asyncio.StreamWriter, upstream: list, first: bytes,
                       raw: list[tuple[bytes, bytes]], body: bytes, method: str) -> bool:
        """Send the request to moto and its answer back; False when moto is gone (drop the client too).
        Without moto (upstream None): 501 NotImplemented."""
        if self._upstream is None:
            await self._send(writer, 501, _REASONS[501], [(b"Content-Type", b"application/xml")],
                             _error("NotImplemented", "Not answered by this listing-only bench server"))
            return True
        try:
            if not upstream:
                upstream.append(await asyncio.open_connection(*self._upstream))
            up_r, up_w = upstream[0]
            out = [first] + [k + b": " + v for k, v in raw if k.lower() not in _HOP]
            if body:
                out.append(b"Content-Length: " + str(len(body)).encode())
            up_w.write(b"\r\n".join(out) + b"\r\n\r\n" + body)
            status_line, r_raw, r_headers = await _read_head(up_r)
            status = int(status_line.split(b" ", 2)[1])
            no_body = method == "HEAD" or status in (204, 304) or status < 200
            data = b"" if no_body else await _read_body(up_r, r_headers)
            closing = r_headers.get(b"connection", b"").lower() == b"close" or data is None
            if data is None:
                data = await up_r.read()
            if closing:
                upstream.pop()[1].close()
        except (OSError, asyncio.IncompleteReadError):
            for _, w in upstream:
                w.close()
            upstream.clear()
            return False
        reason = status_line.split(b" ", 2)[2].decode("latin-1") if status_line.count(b" ") >= 2 else ""
        keep = [(k, v) for k, v in r_raw if k.lower() not in _HOP]
        length = int(r_headers.get(b"content-length", b"0")) if method == "HEAD" else None
        await self._send(writer, status, reason, keep, data, length=length)
        return True

    async def _send(self, writer: asyncio.StreamWriter, status: int, reason: str, headers: list[tuple[bytes, bytes]],
                    data: bytes, length: int | None = None) -> None:
        self._request_id += 1
        lines = [f"HTTP/1.1 {status} {reason}".encode(), *(k + b": " + v for k, v in headers),
                 b"Content-Length: " + str(len(data) if length is None else length).encode(),
                 b"Date: " + email.utils.formatdate(usegmt=True).encode(),
                 b"x-amz-request-id: " + str(self._request_id).encode()]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n")
        if not self.bandwidth:
            writer.write(data)
            await writer.drain()
            return
        for i in range(0, len(data), _STEP):
            writer.write(data[i:i + _STEP])
            await writer.drain()
            await asyncio.sleep(min(_STEP, len(data) - i) / self.bandwidth)
        await writer.drain()


class StaticProxyProcess(ProxyProcess):
    """A StaticProxy in a child process: `pid` for its CPU time; `counts`, `routes` and `max_in_flight`
    read from it over HTTP (objstore_proxy.ProxyProcess's interface)."""

    script = __file__

    def __init__(self, upstream: str | None, index: dict[str, dict], latency: float = 0.020,
                 bandwidth: float | None = None, listing: tuple[int, int] | None = None) -> None:
        super().__init__(upstream or "-", latency, bandwidth)
        fd, self._index_file = tempfile.mkstemp(prefix="coordl-bench-index-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(index, f)
        self._args += [self._index_file, f"{listing[0]},{listing[1]}" if listing else "-"]

    @property
    def routes(self) -> dict[str, int]:
        return self._state("counts")["routes"]

    def stop(self) -> None:
        super().stop()
        if os.path.exists(self._index_file):
            os.unlink(self._index_file)


async def _main(upstream: str, latency: float, bandwidth: float | None, index_file: str, listing: str) -> None:
    with open(index_file) as f:
        index = json.load(f)
    bucket = None
    if listing != "-":
        n, classes = (int(v) for v in listing.split(","))
        bucket = SyntheticBucket("bench", "train", n, classes)
    proxy = StaticProxy(None if upstream == "-" else upstream, index, latency, bandwidth, bucket)
    server = await proxy.serve()
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes it (or dies)
    server.close()


if __name__ == "__main__":  # StaticProxyProcess's child: upstream|- latency bandwidth index.json n,classes|-
    asyncio.run(_main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]) or None, sys.argv[4], sys.argv[5]))
