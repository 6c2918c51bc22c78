"""The pure half of the object-store reader (`cache/storage/objstore.py` is the I/O shell).

- `StoreConfig`: the validated knobs (in-flight bound, per-request timeout, retries, back-off, the
  client of s3:// GETs).
- `backoff`: how long to wait before retry n (exponential, full jitter).
- `Retries`: the one retry loop of every request (async GETs and listings, blocking obstore GETs):
  attempts counted, and after a failure whether and how long to wait before the next.
- `classify`: is an error worth retrying (throttling, 5xx, connection, timeout), or final
  (missing object, access denied, an object changed since it was listed: `ObjectChanged`)?
- `redactor`: the store's `Redactor` (cache/redact.py), knowing the secrets of its storage_options
  and of the environment.
- `walk_order_key`: the order a local copy's walk lists files in, for object keys.

No I/O here: everything is a function of its arguments, tested without a server.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import re

from coordl.errors import ConfigError

from ..redact import Redactor

#: Error class names (from botocore, aiohttp, urllib3, http.client) that mean "the connection
#: or the server failed this time": retried. Matched by name so this module imports none of them.
_RETRYABLE_NAMES = frozenset({
    "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",
    "HTTPClientError", "ClientPayloadError", "ServerDisconnectedError", "ClientConnectorError",
    "ClientOSError", "ResponseParserError", "IncompleteRead", "ProtocolError", "RemoteDisconnected",
    "FSTimeoutError", "ServerTimeoutError",
})
#: Words in an error's text that mean throttling or a server-side failure (S3 503 SlowDown,
#: 500 InternalError, GCS/Azure 429/503): retried.
_RETRYABLE_TEXT = re.compile(
    r"SlowDown|reduce your request rate|ServiceUnavailable|InternalError|Throttl|TooManyRequests|"
    r"\b(?:429|500|502|503|504)\b", re.IGNORECASE)
_RETRYABLE_ERRNOS = frozenset({
    errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED,
    errno.EPIPE, errno.EHOSTUNREACH, errno.ENETUNREACH, getattr(errno, "EREMOTEIO", errno.EIO),
})

#: storage_options keys whose values are credentials (matched case-insensitively, in nested dicts too).
_SECRET_OPTION = re.compile(r"key|secret|token|password|passwd|credential|sas|signature|connection_string",
                            re.IGNORECASE)
#: Environment variables whose values are credentials, read by botocore, gcsfs and adlfs.
SECRET_ENV_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                   "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN",
                   "AZURE_CLIENT_SECRET")


#: StoreConfig.fetch_client's values, and the environment variable that sets its default.
FETCH_CLIENTS = ("auto", "obstore", "s3fs")
FETCH_CLIENT_ENV = "COORDL_S3_CLIENT"


def _default_fetch_client() -> str:
    return os.environ.get(FETCH_CLIENT_ENV) or "auto"


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """How an ObjectStore talks to its store. Defaults: worst case for a dead store that accepts
    connections and never answers is (retries + 1) * timeout + the back-offs = 4 * 10 + ~1.4 s,
    under a minute; a refused connection fails in ~1.5 s."""

    max_in_flight: int = 32      # requests in flight at once per process (GETs, and listing calls)
    timeout: float = 10.0        # seconds one request (connect + whole body) may take before it is retried
    retries: int = 3             # retries after the first attempt, for throttling, 5xx, connection errors
    backoff_base: float = 0.2    # seconds; retry n waits uniform(0, min(backoff_max, base * 2**n))
    backoff_max: float = 5.0     # cap of one back-off, seconds
    # s3:// GETs through obstore or s3fs; auto: obstore when installed and storage_options map onto it
    fetch_client: str = dataclasses.field(default_factory=_default_fetch_client)

    def __post_init__(self) -> None:
        checks = (
            ("max_in_flight", self.max_in_flight, isinstance(self.max_in_flight, int) and 1 <= self.max_in_flight
             <= 1024, "an int from 1 to 1024 (32 keeps a 20 ms store busy enough for ~1,500 objects/s)"),
            ("timeout", self.timeout, isinstance(self.timeout, (int, float)) and 0 < self.timeout <= 600,
             "seconds, more than 0 and at most 600"),
            ("retries", self.retries, isinstance(self.retries, int) and 0 <= self.retries <= 20,
             "an int from 0 to 20"),
            ("backoff_base", self.backoff_base, isinstance(self.backoff_base, (int, float))
             and 0 <= self.backoff_base <= 60, "seconds, from 0 to 60"),
            ("backoff_max", self.backoff_max, isinstance(self.backoff_max, (int, float))
             and self.backoff_base <= self.backoff_max <= 600, "seconds, from backoff_base to 600"),
            ("fetch_client", self.fetch_client, self.fetch_client in FETCH_CLIENTS,
             f"one of {', '.join(map(repr, FETCH_CLIENTS))} (default: ${FETCH_CLIENT_ENV}, else 'auto')"),
        )
        for name, value, ok, want in checks:
            if not ok or isinstance(value, bool):
                raise ConfigError(f"ObjectStore {name}={value!r} is not valid: pass {want}")

    def worst_case_seconds(self) -> float:
        """The longest one object can take to fail: every attempt times out, every back-off is at its cap."""
        waits = sum(min(self.backoff_max, self.backoff_base * 2 ** n) for n in range(self.retries))
        return (self.retries + 1) * self.timeout + waits


def backoff(config: StoreConfig, retry: int, rng: random.Random) -> float:
    """Seconds to wait before retry number `retry` (0-based): exponential back-off with full jitter
    (AWS's recommendation: spreads the retries of many clients throttled at once)."""
    return rng.uniform(0.0, min(config.backoff_max, config.backoff_base * 2 ** retry))


class Retries:
    """One request's attempts under the policy: the one retry loop of the object store.

        retries = Retries(config, rng)
        while True:
            retries.next_attempt()              # counts it (retries.attempts)
            ... the attempt; on success, return its result
            wait = retries.after(err)           # None: stop (a final error, or no retry left)
            if wait is None: return the error
            sleep(wait)                         # time.sleep or asyncio.sleep: the caller's

    An error is retried when `classify` says "retry", at most `config.retries` times in a row; a
    listing that received a page since its last failure calls `progress()`, and the next page has
    its retries again (each page is retried alone)."""

    def __init__(self, config: StoreConfig, rng: random.Random) -> None:
        self.config, self.rng = config, rng
        self.attempts = 0  # attempts made (the first and each retry)
        self.failed = 0    # failures since the last progress (each followed by a retry)

    def next_attempt(self) -> int:
        """Count an attempt about to be made; the attempts made so far, this one included."""
        self.attempts += 1
        return self.attempts

    def after(self, err: BaseException | None) -> float | None:
        """Seconds to wait before the next attempt after `err`, or None when there is none: `err`
        is final (`classify`), or `config.retries` retries in a row failed."""
        if err is None or classify(err) != "retry" or self.failed >= self.config.retries:
            return None
        self.failed += 1
        return backoff(self.config, self.failed - 1, self.rng)

    def progress(self) -> None:
        """The request moved on (a listing received a page): the retries left count from the full number."""
        self.failed = 0


class ObjectChanged(Exception):
    """A GET's object is not the one listed: the store refused its If-Match with the listed ETag
    (HTTP 412 Precondition Failed), or it answered with another size than the listed one."""


class KeyNotNamable(ValueError):
    """A key obstore cannot name (an empty, '.' or '..' segment): its listing goes through s3fs."""


def classify(exc: BaseException) -> str:
    """'missing' (the object or bucket is not there), 'denied' (credentials), 'changed' (the object
    is not the one listed: `ObjectChanged`), 'retry' (throttling, a 5xx, a connection error or a
    timeout) or 'fatal' (anything else: not retried)."""
    if isinstance(exc, ObjectChanged):
        return "changed"
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, PermissionError):
        return "denied"
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return "retry"
    if any(cls.__name__ in _RETRYABLE_NAMES for cls in type(exc).__mro__):
        return "retry"
    if isinstance(exc, OSError) and exc.errno in _RETRYABLE_ERRNOS:
        return "retry"
    if _RETRYABLE_TEXT.search(str(exc)):
        return "retry"
    return "fatal"


def _secret_values(options, out: set[str], secret: bool = False) -> None:
    if isinstance(options, dict):
        for k, v in options.items():
            _secret_values(v, out, secret or bool(_SECRET_OPTION.search(str(k))))
    elif isinstance(options, (list, tuple)):
        for v in options:
            _secret_values(v, out, secret)
    elif secret and isinstance(options, str) and options:
        out.add(options)


#: The parts of an Azure connection string that are credentials by themselves.
_CONNECTION_SECRETS = ("accountkey", "sharedaccesssignature")


def _connection_string_secrets(values: set[str]) -> set[str]:
    """AccountKey=... and SharedAccessSignature=... of every secret that is an Azure connection string:
    a message may quote the key alone (an SDK's own error), not the whole string."""
    out = set()
    for value in values:
        for part in value.split(";"):
            name, sep, secret = part.strip().partition("=")
            if sep and name.lower() in _CONNECTION_SECRETS and secret:
                out.add(secret)
    return out


def redactor(storage_options: dict | None) -> Redactor:
    """The Redactor of an ObjectStore: every credential (storage_options values under key/secret/token/...
    keys, the AWS_/AZURE_ credential environment variables, the key and signature of an Azure
    connection string) and a URL's user:password@ become '***'."""
    found: set[str] = set()
    _secret_values(storage_options or {}, found)
    found.update(v for v in (os.environ.get(n) for n in SECRET_ENV_VARS) if v)
    found.update(_connection_string_secrets(found))
    return Redactor(found)


def walk_order_key(key: str) -> tuple:
    """Sort key that lists object keys in the order a local copy is walked: in each folder its files
    by name, then its sub-folders by name (torchvision's ImageFolder, coordl/manifest/walk.py).
    Plain string order differs: a walk lists 'a/z.jpg' before 'a/b/c.jpg' (files of a/ first),
    string order the other way round."""
    parts = key.split("/")
    return tuple((1, p) for p in parts[:-1]) + ((0, parts[-1]),)
