"""cache/partitioned/mgetread.py: an MGET reply read straight into each value's buffer gives what redis-py's
parser gives, and fails as redis-py does (real redis-server; a scripted socket for broken replies)."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
import redis

from coordl.cache.partitioned import mgetread


def _conn(url: str, timeout: float = 5.0):
    c = redis.Redis.from_url(url, protocol=2, socket_timeout=timeout)
    return c, c.connection_pool.get_connection()


def test_values_match_redis_py(redis_nodes):
    node = redis_nodes()
    client, conn = _conn(node.url)
    rng = np.random.default_rng(5)
    values = {b"big": rng.integers(0, 256, 700_000, dtype=np.uint8).tobytes(),   # many reads
              b"small": b"x" * 10, b"empty": b"", b"edge": b"y" * 256, b"crlf": b"\r\n$3\r\n" * 40}
    client.mset(values)
    client.hset("h", "f", "v")                                  # another type: MGET says nil
    keys = [b"big", b"missing", b"small", b"h", b"empty", b"edge", b"crlf", b"big"]
    conn.send_command("MGET", *keys)
    expected = conn.read_response()
    for _ in range(3):                                          # the connection stays in step
        conn.send_command("MGET", *keys)
        got = mgetread.read_mget(conn)
        assert [None if v is None else bytes(v) for v in got] == expected
        assert all(v is None or v.readonly for v in got)
        assert conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1   # as redis-py needs it
    conn.send_command("PING")
    assert conn.read_response() in (b"PONG", "PONG")
    client.connection_pool.release(conn)
    client.close()


def test_an_error_reply_is_redis_pys_error_and_keeps_the_connection(redis_nodes):
    node = redis_nodes()
    client, conn = _conn(node.url)
    conn.send_command("MGET")                                   # no key: wrong number of arguments
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        mgetread.read_mget(conn)
    conn.send_command("MGET", "a")
    assert mgetread.read_mget(conn) == [None]
    client.connection_pool.release(conn)
    client.close()


def _command(buf: bytes) -> tuple[bytes, bytes] | None:
    """The first whole RESP command in `buf` (`*N` then N bulk strings): (its name, upper-cased;
    the rest of `buf`), or None while it is incomplete."""
    if not buf.startswith(b"*") or b"\r\n" not in buf:
        return None
    head, _, rest = buf.partition(b"\r\n")
    args = []
    for _ in range(int(head[1:])):
        if b"\r\n" not in rest:
            return None
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line[1:])
        if len(rest) < size + 2:
            return None
        args.append(rest[:size])
        rest = rest[size + 2:]
    return args[0].upper(), rest


class _Scripted:
    """A listening socket that answers every command with +OK until MGET, then sends `reply`
    and, with `close`, closes (else it holds the connection open until stopped). Commands are
    read as RESP arrays, however they arrive: redis-py 8 sends its two CLIENT SETINFO in one packet,
    and each gets its own +OK."""

    def __init__(self, reply: bytes, close: bool) -> None:
        self.reply, self.close = reply, close
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"

    def _serve(self) -> None:
        peer, _ = self.sock.accept()
        buf = b""
        with peer:
            while True:
                data = peer.recv(65536)
                if not data:
                    return
                buf += data
                while (parsed := _command(buf)) is not None:
                    name, buf = parsed
                    if name != b"MGET":
                        peer.sendall(b"+OK\r\n")
                        continue
                    peer.sendall(self.reply)
                    if not self.close:
                        self.done.wait(30)
                    return

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)
        self.sock.close()


@pytest.mark.parametrize("reply, close, error", [
    (b"*2\r\n$5\r\nhello\r\n$100000\r\n" + b"z" * 5000, True, redis.ConnectionError),    # closed mid-value
    (b"*2\r\n$5\r\nhello\r\n$100000\r\n" + b"z" * 5000, False, redis.TimeoutError),      # stalls mid-value
    (b"*1\r\n$5\r\nhelloXY\r\n", True, redis.InvalidResponse),                           # no CRLF after it
    (b"+OK\r\n", True, redis.InvalidResponse),                                           # not an array
    (b"*1\r\n:5\r\n", True, redis.InvalidResponse),                                      # not a bulk
    (b"*1\r\n$abc\r\n", True, redis.InvalidResponse),                                    # not a length
])
def test_a_broken_reply_is_a_redis_error_and_disconnects(reply, close, error):
    server = _Scripted(reply, close)
    try:
        client, conn = _conn(server.url, timeout=0.3)
        conn.send_command("MGET", "a", "b")
        with pytest.raises(error):
            mgetread.read_mget(conn)
        assert conn._sock is None                               # out of step: dropped
        client.connection_pool.release(conn)
        client.close()
    finally:
        server.stop()
