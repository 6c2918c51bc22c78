"""Cache-node URLs with passwords in them: built percent-encoded, checked, kept out of every message.

    url = node_url("127.0.0.1", 6390, "p@ss/w:rd#1")   # redis://:p%40ss%2Fw%3Ard%231@127.0.0.1:6390/0
    url_problem("redis://:p@ss/w:rd#1@host:6390/0")     # "... percent-encode ..." (None when fine)
    scrub(str(exc), url)                                # (cache/redact.py) the text with the URL's password as ***
    explain(url, exc)                                   # "authentication failed: ...", "TLS mismatch: ..."

A password is any string: redis.conf takes it quoted, and a URL takes it only
percent-encoded (``@ / : # ? %`` would otherwise move the host, the path or the
fragment: redis-py would then dial a host made of the password's tail, and an
error message would print it).
"""

from __future__ import annotations

import re
import socket
import ssl
import urllib.parse

from ..redact import scrub, userinfo
from . import certdates

_NOT_IN_USERINFO = set("@/?#")


def node_url(host: str, port: int, password: str | None, db: int = 0, scheme: str = "redis",
             user: str | None = None) -> str:
    """The URL of a node, its user and password percent-encoded (any character works)."""
    auth = f":{urllib.parse.quote(password, safe='')}@" if password else ""
    if user:
        auth = f"{urllib.parse.quote(user, safe='')}{auth or '@'}"
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{auth}{host}:{port}/{db}"


def url_problem(url: str) -> str | None:
    """Why redis-py would misread `url` (a password not percent-encoded), or None. Never quotes it."""
    info = userinfo(url)
    bad = sorted(set(info) & _NOT_IN_USERINFO) + (["%"] if re.search(r"%(?![0-9A-Fa-f]{2})", info) else [])
    if not bad:
        return None
    return (f"the password in this URL holds {' '.join(repr(c) for c in bad)}, which must be percent-encoded "
            "(a URL would otherwise put part of it in the host or the path): write it as "
            "urllib.parse.quote(password, safe='') (e.g. '@' as %40, '/' as %2F, '#' as %23)")


def _speaks_plain_redis(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0) as s:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
    except OSError:
        return False
    return reply[:1] in (b"+", b"-")


def _speaks_tls(host: str, port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=2.0) as raw, \
                ctx.wrap_socket(raw, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


def _refuses_without_client_cert(host: str, port: int) -> bool:
    """Does the TLS server at host:port drop a client that shows no certificate (tls-auth-clients)?
    Under TLS 1.3 that shows only after the handshake, as an alert or an EOF on the first read."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=2.0) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
    except ssl.SSLError as e:
        return "certificate required" in str(e).lower() or "eof" in str(e).lower()
    except OSError:
        return False
    return reply == b""


def _peer_certificate(host: str, port: int) -> bytes | None:
    """The certificate the TLS server at host:port shows (DER, not verified: read only to name its
    dates), or None when no handshake completes."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=2.0) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as s:
            return s.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None


def _dates_problem(host: str, port: int, text: str) -> str:
    """An expired or not yet valid certificate in the server's chain, named with its dates."""
    der = _peer_certificate(host, port)
    try:
        problem = certdates.date_problem(der) if der else None
    except ValueError:
        problem = None
    if problem:
        return (f"TLS: the server's certificate at {host}:{port} {problem}: reissue the node's certificate "
                "with dates that include now, and restart the node with it (`coordl cache-node start "
                "--tls-cert NEW.pem --tls-key NEW.key`); check the clocks of both machines")
    when = "has expired" if "expired" in text else "is not yet valid"
    return (f"TLS: a certificate that verifies the server at {host}:{port} {when} (not the server's own: "
            "the CA in ssl_ca_certs= (--tls-ca), or one of the chain it sends): reissue it with dates "
            "that include now; check the clocks of both machines")


def _auth_failed(exc: Exception) -> bool:
    text = str(exc)
    return type(exc).__name__ == "AuthenticationError" or any(
        s in text for s in ("NOAUTH", "WRONGPASS", "invalid username-password", "HELLO must be called"))


def tls_problem(url: str, exc: Exception) -> str | None:
    """The TLS side of a failure to talk to `url`, named with the fix, or None when TLS is not the
    cause: a rediss:// URL at a plain server or the reverse (probed), a server certificate that is
    expired or not yet valid (its dates, read from the server), one the CA does not verify, a server
    that requires a client certificate. No secret of `url` in it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return None
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    text = str(exc).lower()
    if parts.scheme == "rediss" and _speaks_plain_redis(host, port):
        return ("TLS mismatch: the URL asks for TLS (rediss://) but the server at "
                f"{host}:{port} speaks plain Redis: use redis:// (or enable TLS on the server: "
                "`coordl cache-node start --tls-cert F --tls-key F`)")
    if parts.scheme == "redis" and _speaks_tls(host, port):
        return (f"TLS mismatch: the server at {host}:{port} expects TLS and the URL is plain redis://: "
                "use rediss:// (with ssl_ca_certs= the CA that signed its certificate)")
    if "certificate has expired" in text or "certificate is not yet valid" in text:
        return _dates_problem(host, port, text)
    if "certificate verify failed" in text or "unknown ca" in text:
        if "hostname" in text or "ip address mismatch" in text:
            return (f"TLS: the server's certificate does not name {host}: connect by a name or address the "
                    f"certificate lists (subjectAltName), or reissue it for {host}")
        return ("TLS: the server's certificate is not signed by a CA this client trusts (or the server does "
                "not trust the client's): pass ssl_ca_certs= (--tls-ca) the CA file that signed it")
    if ("certificate required" in text or "handshake failure" in text or "bad certificate" in text
            or (parts.scheme == "rediss" and _refuses_without_client_cert(host, port))):
        return ("TLS: the server requires a client certificate (tls-auth-clients) signed by its CA: pass "
                "ssl_certfile= and ssl_keyfile= (--tls-cert/--tls-key of `coordl cache-node status`)")
    return None


def explain(url: str, exc: Exception) -> str:
    """What went wrong talking to the node at `url`, named (auth, TLS, unreachable), with the fix;
    no secret of `url` in it."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if _auth_failed(exc):
        if not (parts.password or parts.username):
            return ("authentication failed: the node requires a password and the URL gives none: "
                    "use redis://:PASSWORD@host:port/db, PASSWORD the node's --password-file content "
                    "percent-encoded (urllib.parse.quote(password, safe=''))")
        if parts.username:
            return ("authentication failed: wrong user or password for this node: use the node's --user and "
                    "the password in its --password-file, percent-encoded: redis://USER:PASSWORD@host:port/db")
        return ("authentication failed: wrong password for this node: use the one in the node's "
                "--password-file, percent-encoded in the URL")
    tls = tls_problem(url, exc)
    if tls:
        return tls
    return (f"unreachable: {scrub(str(exc), url)}: is a node running at {host}:{port} "
            "(`coordl cache-node start`)? check the host, the port and any firewall between")
