"""The socket to a coordinator and `status`: what `coordl status` needs, without torch.

`_Channel` frames protocol messages (coordinator/protocol.py) over the daemon's Unix
socket, tells a daemon that went away from one that is slow (pid plus start time), and
is what a job's `Client` (client.py) talks through. `status` asks a daemon for its
status without attaching. Nothing here imports torch, so `coordl status` starts in a
fraction of a second.
"""

from __future__ import annotations

import os
import select
import socket
import time

from coordl.errors import CoordinatorError

from . import protocol as p
from . import segments
from .config import default_socket_path, parse_address

_CONNECT_TIMEOUT = 10.0
_POLL = 1.0  # seconds between checks that the daemon is alive while waiting


def _connect(sock: socket.socket, path: str) -> None:
    """connect(), waiting up to _CONNECT_TIMEOUT while the daemon's listen queue is full: a Unix
    socket with a timeout fails at once with EAGAIN there instead of waiting."""
    deadline = time.monotonic() + _CONNECT_TIMEOUT
    pause = 0.005
    while True:
        try:
            return sock.connect(path)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise CoordinatorError(
                    f"the coordinator at {path!r} did not accept this connection within "
                    f"{_CONNECT_TIMEOUT:g} s (its queue of new connections stayed full): "
                    f"`coordl status --socket {path}` shows what it is doing") from None
            time.sleep(pause)  # the daemon accepts in its loop; no event tells us when
            pause = min(pause * 2, 0.1)


class _Channel:
    """A blocking connection to the daemon that never waits without checking it lives."""

    def __init__(self, path: str) -> None:
        self.path = path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(_CONNECT_TIMEOUT)
        try:
            _connect(sock, path)
        except CoordinatorError:
            sock.close()
            raise
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            raise CoordinatorError(
                f"no coordinator listens on {path!r}: start one with `coordl serve --data DIR "
                f"--batch-size B --socket {path}`, or pass the socket it printed") from None
        except OSError as e:
            sock.close()
            raise CoordinatorError(f"cannot connect to the coordinator at {path!r}: "
                                   f"{e.strerror or e}") from None
        sock.setblocking(True)
        pid, uid, _ = p.peer_credentials(sock)
        if uid != os.getuid():
            sock.close()
            raise CoordinatorError(f"the process behind {path!r} (pid {pid}) runs as uid {uid}, "
                                   f"not as you (uid {os.getuid()}): refusing to use it")
        self.sock, self.daemon_pid = sock, pid
        self.daemon_start = segments.proc_start(pid)
        self.reader = p.FrameReader(p.TO_JOB, p.MAX_REPLY)
        self.pending: list[p.Message] = []
        self.closed_reason: str | None = None

    def send(self, *msgs: p.Message) -> None:
        self._raise_if_closed()
        try:
            self.sock.sendall(b"".join(m.encode() for m in msgs), socket.MSG_NOSIGNAL)
        except OSError:
            self._read_leftovers()
            self._gone("the connection broke while sending")

    def recv(self, timeout: float | None, waiting_for: str) -> p.Message:
        """The next reply; raises CoordinatorError if the daemon detached us, died or timed out."""
        waited = 0.0
        while not self.pending:
            self._raise_if_closed()
            wait = _POLL if timeout is None else min(_POLL, timeout - waited)
            readable, _, _ = select.select([self.sock], [], [], max(wait, 0.0))
            if readable:
                self._read()
            elif not self._daemon_alive():
                self._gone("its process is gone")
            else:
                waited += wait
                if timeout is not None and waited >= timeout:
                    raise CoordinatorError(
                        f"no reply from the coordinator (pid {self.daemon_pid}) within {timeout:g} s "
                        f"while waiting for {waiting_for}: `coordl status --socket {self.path}` shows "
                        "what it is doing; pass a larger DataLoader timeout (0: no limit)")
        msg = self.pending.pop(0)
        if isinstance(msg, (p.Detached, p.ShuttingDown)):
            self._close(msg.reason)
            raise CoordinatorError(msg.reason)
        return msg

    def _read(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._gone("it closed the connection")
        self.pending.extend(self.reader.feed(data))

    def _read_leftovers(self) -> None:
        """After a failed send: pick up a Detached/ShuttingDown the daemon sent before closing."""
        try:
            while select.select([self.sock], [], [], 0)[0]:
                data = self.sock.recv(1 << 20)
                if not data:
                    break
                self.pending.extend(self.reader.feed(data))
        except (OSError, p.ProtocolError):
            pass
        for msg in self.pending:
            if isinstance(msg, (p.Detached, p.ShuttingDown)):
                self._close(msg.reason)
                raise CoordinatorError(msg.reason)
            if isinstance(msg, p.Refused):  # e.g. the connection limit, before our first message
                reason = f"the coordinator at {self.path} refused this connection: {msg.reason}"
                self._close(reason)
                raise CoordinatorError(reason)

    def _daemon_alive(self) -> bool:
        return segments.proc_start(self.daemon_pid) == self.daemon_start

    def _gone(self, how: str):
        if self.closed_reason is None:
            self._read_leftovers()
        reason = (f"the coordinator (pid {self.daemon_pid}, {self.path}) went away: {how}; "
                  "restart it (coordl serve), run `coordl cleanup` if it was killed, and restart "
                  "this job")
        self._close(reason)
        raise CoordinatorError(reason)

    def _raise_if_closed(self) -> None:
        if self.closed_reason is not None:
            raise CoordinatorError(self.closed_reason)

    def _close(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self, reason: str) -> None:
        if self.closed_reason is None:
            try:
                self.sock.sendall(p.Bye().encode(), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
            except OSError:
                pass
        self._close(reason)


def status(address: str | os.PathLike | None = None, timeout: float = 10.0) -> dict:
    """The status of the daemon at `address` (default socket when None), without attaching."""
    channel = _Channel(parse_address(address) if address else default_socket_path())
    try:
        channel.send(p.Status())
        reply = channel.recv(timeout, "its status")
        if isinstance(reply, p.Refused):
            raise CoordinatorError(f"the coordinator at {channel.path} refused: {reply.reason}")
        if not isinstance(reply, p.StatusReply):
            raise CoordinatorError(f"the coordinator answered status with {reply.TYPE!r}")
        return reply.status
    finally:
        channel.close("status done")
