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
objstore_proxy.ProxyProcess), so its CPU time is measured apart from the client's. Its CPU is bench
overhead on the cores the measured loaders use, so a static read is cheap: an asyncio.Protocol parses
requests from the bytes as they come (no StreamReader, no task), a timer answers it after the latency,
its bytes are held in memory once read (4 GiB at most), its head is precomputed but for the Date (once a
second) and request id, and head and body go out in one writev (~0.08 ms of CPU per 100 KiB GET, was
~0.11). Not part of the library: coordl never imports it.
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
import time
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
_MEMORY = 4 << 30  # object bytes a StaticProxy holds in memory at most (beyond: read from the file on each GET)
_HEAD_LIMIT = 64 * 1024  # a request head longer than this drops the connection (StreamReader's limit)


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


def _body(buf: bytes, start: int, headers: dict[bytes, bytes]) -> tuple[bytes, bytes, int]:
    """(body, the bytes after it, 0) of the request whose head ends at buf[start], or (b"", b"", n) while
    its body is not all in `buf` (n: the length buf needs, or len(buf) + 1 if unknown)."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        parts, i = [], start
        while True:
            eol = buf.find(b"\r\n", i)
            if eol < 0:
                return b"", b"", len(buf) + 1
            n = int(buf[i:eol].split(b";")[0], 16)
            if n == 0:
                while eol >= 0 and buf[eol + 2:eol + 4] != b"\r\n":  # trailers, then a blank line
                    eol = buf.find(b"\r\n", eol + 2)
                if eol < 0 or len(buf) < eol + 4:
                    return b"", b"", len(buf) + 1
                return b"".join(parts), buf[eol + 4:], 0
            if len(buf) < eol + n + 4:
                return b"", b"", eol + n + 4
            parts.append(buf[eol + 2:eol + 2 + n])
            i = eol + n + 4
    n = int(headers.get(b"content-length", b"0"))
    if len(buf) < start + n:
        return b"", b"", start + n
    return buf[start:start + n], buf[start + n:], 0


class _Object:
    """An index entry as the static route answers it: its bytes once read (None: not held, read from the
    file each time) and the constant start of each answer's head (up to its Date line)."""

    __slots__ = ("path", "size", "etag", "data", "whole", "checksum", "ranged")

    def __init__(self, entry: dict) -> None:
        self.path, self.size, self.etag = entry["path"], entry["size"], entry["etag"]
        self.data: bytes | None = None
        common = (f"Content-Type: binary/octet-stream\r\nETag: {self.etag}\r\nLast-Modified: {entry['last_modified']}"
                  "\r\nAccept-Ranges: bytes\r\n")
        self.whole = f"HTTP/1.1 200 OK\r\n{common}Content-Length: {self.size}\r\n".encode()  # GET and HEAD
        self.checksum = (f"HTTP/1.1 200 OK\r\n{common}x-amz-checksum-crc32: {entry['crc32']}\r\n"
                         f"Content-Length: {self.size}\r\n").encode()
        self.ranged = f"HTTP/1.1 206 Partial Content\r\n{common}".encode()


class StaticProxy:
    """See the module docstring. Runs on the calling thread's event loop (`serve`). Object bytes are held
    in memory once read, `memory` bytes at most (the rest are read from their file on each GET), so
    that the static route costs this process ~1 send per answer: its CPU is bench overhead on the
    cores the measured loaders use."""

    def __init__(self, upstream: str | None, index: dict[str, dict], latency: float = 0.020,
                 bandwidth: float | None = None, listing: SyntheticBucket | None = None,
                 memory: int = _MEMORY) -> None:
        parsed = urllib.parse.urlsplit(upstream or "")
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80) if upstream else None
        self.index, self.latency, self.bandwidth, self.listing = index, latency, bandwidth, listing
        self.memory, self.held = memory, 0
        self.counts: dict[str, int] = {}
        self.routes = {"static": 0, "moto": 0, "listing": 0}
        self.in_flight = self.max_in_flight = 0
        self._request_id = 0
        self._objects: dict[str, _Object] = {}
        self._date_at, self._date = -1, b""
        # the fast path (_Connection._start) answers static reads from a timer callback; it skips
        # what it cannot do at once: listing first, paced bodies
        self.fast = listing is None and not bandwidth

    def state(self) -> dict:
        return {"counts": self.counts, "routes": self.routes, "max_in_flight": self.max_in_flight}

    def reset_counts(self) -> None:
        self.counts, self.routes = {}, {"static": 0, "moto": 0, "listing": 0}
        self.max_in_flight = self.in_flight

    async def serve(self) -> asyncio.Server:
        return await asyncio.get_running_loop().create_server(lambda: _Connection(self), "127.0.0.1", 0)

    def begin(self, method: str) -> None:
        """A request that is not for /__proxy__/: counted, and in flight until `end`."""
        self.counts[method] = self.counts.get(method, 0) + 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def end(self) -> None:
        self.in_flight -= 1

    async def request(self, conn: _Connection, first: bytes, raw: list[tuple[bytes, bytes]],
                      headers: dict[bytes, bytes], body: bytes, method: str, target: str) -> bool:
        """Answer a request the fast path does not; False: drop the connection (moto is gone)."""
        if target.startswith("/__proxy__/"):
            if target == "/__proxy__/reset":
                self.reset_counts()
            await self._send(conn, 200, "OK", [(b"Content-Type", b"application/json")],
                             json.dumps(self.state()).encode())
            return True
        self.begin(method)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            listed = self.listing.answer(method, target) if self.listing is not None else None
            obj = self.static(method, target, headers) if listed is None else None
            if listed is not None:
                self.routes["listing"] += 1
                status, head, data = listed
                length = next((int(v) for k, v in head if k == b"Content-Length"), None)
                await self._send(conn, status, _REASONS.get(status, "Not Found"),
                                 [(k, v) for k, v in head if k != b"Content-Length"], data, length=length)
            elif obj is not None:
                self.routes["static"] += 1
                head, data = self.answer(method, obj, headers)
                conn.write(head)
                await self._pace(conn, data)
            else:
                self.routes["moto"] += 1
                return await self._forward(conn, conn.upstream, first, raw, body, method)
        finally:
            self.end()
        return True

    def static(self, method: str, target: str, headers: dict[bytes, bytes]) -> _Object | None:
        """The indexed object this request reads (GET or HEAD, no conditions moto must decide, no query
        but x-id), None if it goes to moto."""
        if method not in ("GET", "HEAD") or _FORWARD_IF & headers.keys():
            return None
        path, _, query = target.partition("?")
        if query and any(not p.startswith("x-id=") for p in query.split("&")):
            return None
        obj = self._objects.get(path)
        if obj is None:
            entry = self.index.get(path)
            if entry is None:
                return None
            obj = self._objects[path] = _Object(entry)
        return obj

    def answer(self, method: str, obj: _Object, headers: dict[bytes, bytes]) -> tuple[bytes, bytes | memoryview]:
        """(head, body) of the static route's answer to this GET or HEAD of `obj`."""
        size = obj.size
        if_match = headers.get(b"if-match")
        if if_match is not None and if_match.decode() not in (obj.etag, "*"):
            data = _error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold",
                          Condition="If-Match")
            return self._head(412, _REASONS[412], [(b"Content-Type", b"application/xml")], len(data)), data
        if method == "HEAD":
            return obj.whole + self._tail(), b""
        spec = headers.get(b"range")
        if spec is None:
            head = obj.checksum if headers.get(b"x-amz-checksum-mode", b"").lower() == b"enabled" else obj.whole
            return head + self._tail(), self._bytes(obj, 0, size - 1)
        got = _range(spec.decode(), size)
        if got is None:
            data = _error("InvalidRange", "The requested range is not satisfiable", ActualObjectSize=str(size),
                          RangeRequested=spec.decode())
            return self._head(416, _REASONS[416], [(b"Content-Type", b"application/xml")], len(data)), data
        first, last = got
        head = b"%sContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n" % (obj.ranged, first, last, size,
                                                                              last - first + 1)
        return head + self._tail(), self._bytes(obj, first, last)

    def _bytes(self, obj: _Object, first: int, last: int) -> bytes | memoryview:
        """Bytes first..last of `obj`: from memory, its whole file read into it the first time while
        `memory` allows, else read from the file."""
        data = obj.data
        if data is None:
            with open(obj.path, "rb") as f:
                if self.held + obj.size > self.memory:
                    f.seek(first)
                    return f.read(last - first + 1)
                data = obj.data = f.read()
            self.held += len(data)
        return data if first == 0 and last == len(data) - 1 else memoryview(data)[first:last + 1]

    def _tail(self) -> bytes:
        """The head's last lines: Date (formatted once a second), x-amz-request-id, the blank line."""
        self._request_id += 1
        now = int(time.time())
        if now != self._date_at:
            self._date_at, self._date = now, b"Date: " + email.utils.formatdate(now, usegmt=True).encode()
        return b"%s\r\nx-amz-request-id: %d\r\n\r\n" % (self._date, self._request_id)

    def _head(self, status: int, reason: str, headers: list[tuple[bytes, bytes]], length: int) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}".encode(), *(k + b": " + v for k, v in headers),
                 b"Content-Length: " + str(length).encode()]
        return b"\r\n".join(lines) + b"\r\n" + self._tail()

    async def _forward(self, writer: _Connection, upstream: list, first: bytes,
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

    async def _send(self, writer: _Connection, status: int, reason: str, headers: list[tuple[bytes, bytes]],
                    data: bytes, length: int | None = None) -> None:
        writer.write(self._head(status, reason, headers, len(data) if length is None else length))
        await self._pace(writer, data)

    async def _pace(self, writer: _Connection, data: bytes | memoryview) -> None:
        """Write a body: at once, or at `bandwidth` bytes/s."""
        if not self.bandwidth:
            writer.write(data)
            await writer.drain()
            return
        for i in range(0, len(data), _STEP):
            writer.write(data[i:i + _STEP])
            await writer.drain()
            await asyncio.sleep(min(_STEP, len(data) - i) / self.bandwidth)
        await writer.drain()


class _Connection(asyncio.Protocol):
    """One client connection of a StaticProxy: requests parsed from the bytes as they come and answered
    one at a time, in order. A static read (StaticProxy.fast) is answered by a timer callback after
    the latency, its head and body written at once; anything else by a task running
    StaticProxy.request, which writes through `write` and `drain` as through a StreamWriter."""

    def __init__(self, proxy: StaticProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self._fd = -1  # the socket's, for one writev of head and body while the transport holds nothing
        self._loop = asyncio.get_running_loop()
        self.upstream: list = []  # [(reader, writer)] to moto while it keeps the connection open
        self._parts: list[bytes] = []  # what arrived and is not parsed yet
        self._have = self._need = 0  # their length; the length a whole request needs, when known
        self._busy = self._eof = self._closed = self._paused = False
        self._task: asyncio.Task | None = None
        self._drained: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._fd = transport.get_extra_info("socket").fileno()

    def data_received(self, data: bytes) -> None:
        self._parts.append(data)
        self._have += len(data)
        if self._have >= self._need:  # joined only once a body being sent may be whole
            self._next()

    def eof_received(self) -> bool:
        self._eof = True
        self._next()
        return True  # closed by _next once the requests before the end are answered

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("Connection lost"))
        if self._task is None or self._task.done():
            self._close_upstream()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def write(self, data: bytes | memoryview) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if self._closed:
            raise ConnectionResetError("Connection lost")
        if self._paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def _close(self) -> None:
        assert self.transport is not None
        self.transport.close()
        self._busy = True  # nothing more is read from this connection

    def _close_upstream(self) -> None:
        for _, w in self.upstream:
            w.close()
        self.upstream.clear()

    def _next(self) -> None:
        """Start the requests in the buffer while none is being answered."""
        while not self._busy and not self._closed:
            try:
                if not self._start():
                    return
            except (ValueError, IndexError):  # not HTTP
                self._close()

    def _start(self) -> bool:
        """Start answering the first request in the buffer; False: none is whole yet."""
        if not self._parts:
            if self._eof:
                self._close()
            return False
        buf = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts = [buf]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if self._eof or len(buf) > _HEAD_LIMIT:
                self._close()
            return False
        lines = buf[:end].split(b"\r\n")
        raw = [(k, v.strip()) for k, _, v in (line.partition(b":") for line in lines[1:])]
        headers = {k.lower(): v for k, v in raw}
        body, rest, self._need = _body(buf, end + 4, headers)
        if self._need:
            if self._eof:
                self._close()
            return False
        self._parts, self._have = [rest] if rest else [], len(rest)
        method, target, _ = lines[0].decode("latin-1").split(" ", 2)
        self._busy = True
        proxy = self.proxy
        obj = proxy.static(method, target, headers) if proxy.fast and not target.startswith("/__proxy__/") else None
        if obj is None:
            self._task = self._loop.create_task(
                self._request(lines[0], raw, headers, body, method, target))
            return True
        proxy.begin(method)
        if proxy.latency:
            self._loop.call_later(proxy.latency, self._answer, method, obj, headers)
        else:
            self._answer(method, obj, headers, again=False)
        return True

    def _answer(self, method: str, obj: _Object, headers: dict[bytes, bytes], again: bool = True) -> None:
        """The fast path's answer (after the latency); then the next request if `again`."""
        assert self.transport is not None
        proxy = self.proxy
        try:
            proxy.routes["static"] += 1
            head, data = proxy.answer(method, obj, headers)
        except (ValueError, IndexError):  # an unreadable Range
            self._close()
            return
        finally:
            proxy.end()
        if self._closed:
            return
        self._send(head, data)
        if headers.get(b"connection", b"").lower() == b"close":
            self._close()
            return
        self._busy = False
        if again:
            self._next()

    def _send(self, head: bytes, data: bytes | memoryview) -> None:
        """Head and body in one writev when the transport has nothing queued (else, and what the socket
        did not take, queued after it): no copy of the body, one segment less than two sends."""
        assert self.transport is not None
        sent = 0
        if not self.transport.get_write_buffer_size():
            try:
                sent = os.writev(self._fd, (head, data))
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:  # gone: the transport meets the same error below and closes
                pass
        if sent < len(head):
            self.transport.write(head[sent:])
            self.transport.write(data)
        elif sent < len(head) + len(data):
            self.transport.write(memoryview(data)[sent - len(head):])

    async def _request(self, first: bytes, raw: list[tuple[bytes, bytes]], headers: dict[bytes, bytes],
                       body: bytes, method: str, target: str) -> None:
        try:
            if not await self.proxy.request(self, first, raw, headers, body, method, target):
                self._close()
            elif headers.get(b"connection", b"").lower() == b"close":
                self._close()
            else:
                self._busy = False
                self._next()
        except (ConnectionError, asyncio.CancelledError):  # gone, or this process is stopping
            self._close()
        finally:
            if self._closed or self.transport is None or self.transport.is_closing():
                self._close_upstream()


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
