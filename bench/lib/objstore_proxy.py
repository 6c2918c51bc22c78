"""A fault-injecting HTTP proxy in front of an S3-protocol server, for tests and benches.

    proxy = FaultProxy("http://127.0.0.1:9000", latency=0.020).start()   # proxy.url to clients
    proxy.inject(503, 3)        # the next 3 GETs answer 503 SlowDown (without reaching the server)
    proxy.counts["GET"]         # requests seen, by method (injected ones included)
    proxy.ranged                # of those, the ones with a Range header
    proxy.max_in_flight         # the most requests it held at once
    proxy.hang = True           # accept requests, never answer (a store that went silent)
    proxy.stop()                # closes the listening socket and every client connection

Each request waits `latency` seconds before it is forwarded (one round trip to a remote store);
`bandwidth` (bytes/s, per connection) paces the response body. Requests are forwarded unchanged
(the Host header too, so SigV4 signatures stay valid), one upstream keep-alive connection per
client connection. Not part of the library: coordl never imports it.

    proxy = ProxyProcess("http://127.0.0.1:9000", latency=0.020).start()   # the same, in a process
    proxy.pid, proxy.counts, proxy.reset_counts(), proxy.stop()             # of its own (CPU apart)

`ProxyProcess` runs this file as a script (a FaultProxy whose /__proxy__/counts and
/__proxy__/reset answer the parent instead of being forwarded); it exits when the parent closes its
stdin or stops it.
"""

from __future__ import annotations

import collections
import http.client
import json
import socket
import subprocess
import sys
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
        if proxy.control and self.path.startswith("/__proxy__/"):
            self._control(proxy)
            return
        injected = proxy._on_request(self.command)
        self._held = True
        if "Range" in self.headers:
            proxy._on_ranged()
        try:
            self._answer(proxy, body, injected)
        finally:
            self._release(proxy)

    def _release(self, proxy: FaultProxy) -> None:
        """The request is no longer held: counted out of `in_flight` once, before its answer's
        first byte goes out. A client may send its next request as soon as it has read an
        answer, and this thread may not have run again by then: counted out after the answer,
        the two would overlap here though they never did at the client."""
        if getattr(self, "_held", False):
            self._held = False
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

    def _control(self, proxy: FaultProxy) -> None:
        if self.path == "/__proxy__/reset":
            proxy.reset_counts()
        with proxy._lock:
            state = {"counts": dict(proxy.counts), "max_in_flight": proxy.max_in_flight}
        self._reply(200, "OK", {"Content-Type": "application/json"}, json.dumps(state).encode())

    def _reply(self, status: int, reason: str, headers: dict, data: bytes, keep_length: bool = False) -> None:
        self._release(self.server.proxy)  # type: ignore[attr-defined]
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

    def handle_error(self, request, client_address) -> None:
        """A client that went away mid-answer (a loader's workers stopped) is not news; others are."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)

    def process_request(self, request, client_address):
        self.proxy._conns.add(request)  # type: ignore[attr-defined]
        super().process_request(request, client_address)


class FaultProxy:
    """See the module docstring."""

    def __init__(self, upstream: str, latency: float = 0.020, bandwidth: float | None = None,
                 control: bool = False) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._host, self._port = parsed.hostname, parsed.port or 80
        self.latency, self.bandwidth, self.hang, self.control = latency, bandwidth, False, control
        self.counts: collections.Counter = collections.Counter()
        self.ranged = 0  # requests that carried a Range header (counted in `counts` too)
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
            self.ranged = 0
            self.max_in_flight = self.in_flight

    def _on_ranged(self) -> None:
        with self._lock:
            self.ranged += 1

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


class ProxyProcess:
    """A FaultProxy in a child process (see the module docstring): `pid` for its CPU time; `counts`
    and `max_in_flight` read from it over HTTP."""

    script = __file__  # what the child runs: `script upstream latency bandwidth [more args]`

    def __init__(self, upstream: str, latency: float = 0.020, bandwidth: float | None = None) -> None:
        self._args = [upstream, str(latency), str(bandwidth or 0)]
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ProxyProcess:
        self.proc = subprocess.Popen([sys.executable, self.script, *self._args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        return self

    def _state(self, what: str) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", f"/__proxy__/{what}")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    @property
    def counts(self) -> collections.Counter:
        return collections.Counter(self._state("counts")["counts"])

    @property
    def max_in_flight(self) -> int:
        return self._state("counts")["max_in_flight"]

    def reset_counts(self) -> None:
        self._state("reset")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":  # ProxyProcess's child: upstream latency bandwidth
    _proxy = FaultProxy(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]) or None, control=True).start()
    print(_proxy.url.rsplit(":", 1)[1], flush=True)
    sys.stdin.read()  # until the parent closes it (or dies)
    _proxy.stop()
