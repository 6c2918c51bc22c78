"""TLS options of cache-node clients: checked once, then given to redis-py for every ``rediss://`` node.

    tls = options(nodes, ssl_ca_certs="ca.pem", ssl_certfile="client.pem", ssl_keyfile="client.key")
    redis.Redis.from_url("rediss://host:6390/0", **tls)

The server's certificate is always verified (redis-py's ``ssl_cert_reqs='required'`` and host
name check): against `ssl_ca_certs` when given, else the system's CAs. `ssl_certfile` and
`ssl_keyfile` are the client's certificate for a node that requires one (mutual TLS,
redis-server ``tls-auth-clients yes``). The files are read by the ssl module at each connection;
nothing of them is printed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from coordl.errors import ConfigError

from . import certdates

_WHAT = {"ssl_ca_certs": "the CA certificate that signed the nodes' certificates",
         "ssl_certfile": "the client certificate", "ssl_keyfile": "the client private key"}


def options(nodes: Sequence[str], ca: str | None, cert: str | None, key: str | None) -> dict[str, str]:
    """redis-py keyword arguments for the ``rediss://`` nodes; ConfigError for a file that cannot be
    read, a key without a certificate, or TLS files with no ``rediss://`` node to use them."""
    given = {"ssl_ca_certs": ca, "ssl_certfile": cert, "ssl_keyfile": key}
    out = {}
    for name, path in given.items():
        if path is None:
            continue
        if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError(f"{name}={path!r} is not a readable file: give the path of a PEM file "
                              f"({_WHAT[name]})")
        out[name] = os.fspath(path)
    if cert is not None:
        check_certificate(out["ssl_certfile"], "ssl_certfile=", "the client certificate")
    if key is not None and cert is None:
        raise ConfigError("ssl_keyfile= was given without ssl_certfile=: the client key goes with its certificate")
    if out and not any(str(u).startswith("rediss://") for u in nodes):
        raise ConfigError(f"{', '.join(f'{k}=' for k in out)} given, but no node URL is rediss:// (TLS): "
                          "write the TLS nodes as rediss://host:port/db")
    return out


def check_certificate(path: str, flag: str, what: str) -> None:
    """Refuse a PEM file whose certificates (the first, and any chain after it) are expired or not
    yet valid, or that holds none: ConfigError naming `flag`, the file, the dates and the fix. Every
    peer would refuse such a certificate; a node started with it would serve no client."""
    try:
        with open(path, errors="replace") as f:
            certs = certdates.pem_certificates(f.read())
        problems = [certdates.date_problem(der) for der in certs]
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag} {path}: cannot read {what} ({e}): give a PEM certificate file") from None
    if not certs:
        raise ConfigError(f"{flag} {path} holds no certificate (no BEGIN CERTIFICATE block): give a PEM "
                          f"certificate file ({what})")
    for i, problem in enumerate(problems):
        if problem:
            which = what if i == 0 else f"certificate {i + 1} of the chain in it"
            raise ConfigError(f"{flag} {path}: {which} {problem}: reissue it with dates that include "
                              "now (e.g. openssl x509 -req ... -days 365) and give the new file")
