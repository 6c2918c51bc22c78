"""A fault-injecting HTTP proxy in front of an S3-protocol server, for tests and benches.

    proxy = FaultProxy("http://127.0.0.1:9000", latency=0.020).start()   # proxy.url to clients
    proxy.inject(503, 3)        # the next 3 GETs answer 503 SlowDown (without reaching the server)
    proxy.counts["GET"]         # requests seen, by method (injected ones included)
    proxy.max_in_flight         # the most requests it held at once
    proxy.hang = True           # accept requests, never answer (a store that went silent)
    proxy.stop()                # closes the listening socket and every client connection

Each request waits `latency` seconds before it is forwarded (one round trip to a remote store);
`bandwidth` (bytes/s, per connection) paces the response body. Requests are forwarded unchanged
(the Host header too, so SigV4 signatures stay valid), one upstream keep-alive connection per
client connection. Not part of the library: coordl never imports it.
"""

from __future__ import annotations

import collections
import http.client
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: http.client.HTTPConnection | None = None

    def log_message(self, *args) -> None:  # quiet
        pass

    def _forward(self) -> None:
        proxy: FaultProxy = self.server.proxy  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        injected = proxy._on_request(self.command)
        try:
            self._answer(proxy, body, injected)
        finally:
            proxy._on_done()

    def _answer(self, proxy: FaultProxy, body: bytes, injected: int) -> None:
        if proxy.hang:
            proxy._stopped.wait()
            self.close_connection = True
            return
        if proxy.latency:
            time.sleep(proxy.latency)
        if injected:
            self._reply(injected, "Service Unavailable", {"Content-Type": "application/xml"}, _SLOWDOWN)
            return
        try:
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
            self.upstream.request(self.command, self.path, body=body or None, headers=dict(self.headers))
            resp = self.upstream.getresponse()
            data = resp.read()
        except OSError:
            self.upstream = None
            self.close_connection = True  # the server is gone: drop the client's connection too
            return
        headers = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP}
        if self.command == "HEAD":
            self._reply(resp.status, resp.reason, headers, b"", keep_length=True)
        else:
            self._reply(resp.status, resp.reason, headers, data)

    def _reply(self, status: int, reason: str, headers: dict, data: bytes, keep_length: bool = False) -> None:
        self.send_response_only(status, reason)
        for k, v in headers.items():
            if k.lower() != "content-length" or keep_length:
                self.send_header(k, v)
        if not keep_length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        bandwidth = self.server.proxy.bandwidth  # type: ignore[attr-defined]
        step = 64 * 1024
        for i in range(0, len(data), step):
            self.wfile.write(data[i:i + step])
            if bandwidth:
                time.sleep(min(step, len(data) - i) / bandwidth)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def process_request(self, request, client_address):
        self.proxy._conns.add(request)  # type: ignore[attr-defined]
        super().process_request(request, client_address)


class FaultProxy:
    """See the module docstring."""

    def __init__(self, upstream: str, latency: float = 0.020, bandwidth: float | None = None) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._host, self._port = parsed.hostname, parsed.port or 80
        self.latency, self.bandwidth, self.hang = latency, bandwidth, False
        self.counts: collections.Counter = collections.Counter()
        self.in_flight = self.max_in_flight = 0
        self._inject: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._conns: set = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def inject(self, status: int, n: int, method: str = "GET") -> None:
        """The next `n` requests with `method` answer `status` (503: S3's SlowDown body) at once."""
        with self._lock:
            self._inject.extend([(method, status)] * n)

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.max_in_flight = self.in_flight

    def _on_request(self, method: str) -> int:
        with self._lock:
            self.counts[method] += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self._inject and self._inject[0][0] == method:
                return self._inject.popleft()[1]
            return 0

    def _on_done(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
