"""Reading an MGET reply of large values with one copy each: from the socket into the value's buffer.

    conn.send_command("MGET", *keys)
    values = read_mget(conn)   # [memoryview | None, ...], as conn.read_response() would give bytes

redis-py's parser copies each value three times (hiredis: socket -> its read buffer
-> the reader's buffer -> a bytes object); the pure-Python parser as often. For the
~100 KiB values of the partitioned cache those copies were a quarter of the process
CPU per item (docs/results.md, "Partitioned caching over a shaped network"). Here the
RESP2 framing (``*N``, then ``$len`` + payload per value, ``$-1`` for a missing key)
is read in small reads and each payload with ``recv_into`` straight into its own
buffer; the values come back as read-only memoryviews. The buffers come from the process's
pool (cache/partitioned/recycle.py): one that no view refers to any more is filled again, so its pages
are not faulted in and zeroed anew for every value.

Errors are redis-py's, as ``conn.read_response()`` raises them: an error reply is the
parser's `ResponseError` (the connection stays usable); a timeout (the socket's
``socket_timeout``) is `redis.TimeoutError`, a reset or closed connection
`redis.ConnectionError`, a reply that is not an array of bulk strings
`redis.InvalidResponse`; after any of these but an error reply the connection is
disconnected (its stream is no longer in step). When the reply cannot be read this way
(redis-py's parser already holds bytes of the stream, RESP3, no socket) it is
``conn.read_response()``.
"""

from __future__ import annotations

import socket
from typing import Any

from . import recycle, redisnode

_SMALL = 256             # bytes per read of the framing (a value's payload is read on its own)
_MAX_LINE = 64 * 2**10   # a framing line longer than this is not Redis
_LOWAT_MIN = 32 * 2**10  # a value with more than this still to come is waited for with SO_RCVLOWAT,
_LOWAT_MAX = 128 * 2**10  # at most this much per wake-up (progress within the timeout on slow links)
_MAX_BULK = 2**32        # nor a value over 4 GiB (Redis' proto-max-bulk-len: 512 MiB by default)


def read_mget(conn: Any) -> list[memoryview | None]:
    """The values of the MGET just sent on redis-py connection `conn` (None for a missing key or a
    value of another type); see the module docstring."""
    sock = getattr(conn, "_sock", None)
    if sock is None or not _parser_empty(conn) or str(getattr(conn, "protocol", 2) or 2) != "2":
        return conn.read_response()
    redis = redisnode.redis_module()
    try:
        return _Reply(sock).read(conn)
    except redis.ResponseError:
        raise  # a whole error reply was read: the connection is in step
    except TimeoutError:  # (socket.timeout)
        conn.disconnect()
        raise redis.TimeoutError(f"Timeout reading from {_where(conn)}") from None
    except OSError as e:
        conn.disconnect()
        raise redis.ConnectionError(f"Error while reading from {_where(conn)} : {e.args}") from None
    except BaseException:
        conn.disconnect()
        raise


class _Reply:
    """One reply's framing, read from `sock` in small reads; payloads go straight to their buffers.

    Bytes read past the reply's end are not kept: one request at a time per connection (what
    PartitionedCache does, read-ahead included: it sends a batch's MGETs once the last replies
    on those connections are read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf, self.pos = sock, bytearray(), 0
        # plain TCP (not TLS, whose bytes on the wire are not the payload's; not unix sockets)
        self.tcp = type(sock) is socket.socket and sock.family in (socket.AF_INET, socket.AF_INET6)

    def read(self, conn: Any) -> list[memoryview | None]:
        redis = redisnode.redis_module()
        head = self.line()
        if head[:1] == b"-":
            raise conn._parser.parse_error(head[1:].decode("utf-8", "replace"))
        count = _int(head, b"*")
        values: list[memoryview | None] = []
        for _ in range(count):
            size = _int(self.line(), b"$")
            if size < 0:
                values.append(None)
                continue
            if size > _MAX_BULK:
                raise redis.InvalidResponse(f"a value of {size} bytes: not a Redis reply")
            values.append(self.payload(size))
            if self.line() != b"":
                raise redis.InvalidResponse("a value not followed by CRLF: not a Redis reply")
        return values

    def line(self) -> bytes:
        """The next CRLF-terminated line, without its CRLF."""
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                out = bytes(self.buf[self.pos:end])
                self.pos = end + 2
                return out
            if len(self.buf) - self.pos > _MAX_LINE:
                raise redisnode.redis_module().InvalidResponse("a line without CRLF: not a Redis reply")
            del self.buf[:self.pos]
            self.pos = 0
            self.buf += self._recv(_SMALL)

    def payload(self, size: int) -> memoryview:
        """`size` bytes: those already read, then the rest received into the same buffer, which also
        takes up to `_SMALL` bytes after them (the next value's framing: no read of its own)."""
        view = recycle.process_pool().take(size + _SMALL).data  # pages mapped once, reused when let go
        have = min(len(self.buf) - self.pos, size)
        view[:have] = self.buf[self.pos:self.pos + have]
        self.pos += have
        lowat = 1
        try:
            while have < size:
                want = min(size - have, _LOWAT_MAX) if self.tcp and size - have > _LOWAT_MIN else 1
                if want != lowat:  # wake up once the value (or _LOWAT_MAX of it) is in, not per packet
                    self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                    lowat = want
                got = self.sock.recv_into(view[have:])
                if not got:
                    raise ConnectionResetError("connection closed by the server")
                have += got
        finally:
            if lowat != 1 and self.sock.fileno() >= 0:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        if have > size:
            self.buf, self.pos = bytearray(view[size:have]), 0
        return view[:size].toreadonly()

    def _recv(self, n: int) -> bytes:
        data = self.sock.recv(n)
        if not data:
            raise ConnectionResetError("connection closed by the server")
        return data


def _int(line: bytes, kind: bytes) -> int:
    if line[:1] != kind:
        raise redisnode.redis_module().InvalidResponse(
            f"expected {kind.decode()}, got {line[:32]!r}: not an MGET reply")
    try:
        return int(line[1:])
    except ValueError:
        raise redisnode.redis_module().InvalidResponse(f"{line[:32]!r} is not a length") from None


def _parser_empty(conn: Any) -> bool:
    """Whether redis-py's parser holds none of `conn`'s stream (everything left is in the socket)."""
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if reader is not None:  # hiredis
        has_data = getattr(reader, "has_data", None)
        return has_data is not None and not has_data()
    buffer = getattr(parser, "_buffer", None)  # redis-py's RESP2 parser
    unread = getattr(buffer, "unread_bytes", None)
    return unread is not None and unread() == 0


def _where(conn: Any) -> str:
    describe = getattr(conn, "_host_error", None)
    return str(describe()) if callable(describe) else "the node"
