"""The obstore (Rust object_store) path of `cache/storage/objstore.py` for s3:// item reads and listings.

`s3_config(root, storage_options, environ)` maps the storage_options a user passes to s3fs onto
obstore's S3Store, or says why it cannot (then the store reads through s3fs: an option is never
dropped). `ObstoreGetter` makes the whole-object and ranged GETs; each call is ONE HTTP request
(obstore's own retries are off: `retry_config={"max_retries": 0}`), so `objstore.py` keeps the
retries, back-off, timeouts and counters of `policy.py` for both clients. obstore's
errors come back as the built-in kinds `classify` knows (FileNotFoundError, PermissionError,
`S3ServerError` (a ConnectionError: retried), `S3RequestError` (final)), with the server's code
and message and without its debug dump.

`ObstoreGetter.list_pages` lists the class prefixes for `objstore.py` (which keeps the retries, resuming
a prefix after its last key received): obstore parses ListObjectsV2 in Rust and hands over plain
(key, size, ETag) tuples, about a tenth of botocore's client CPU per object (botocore parses each
object's LastModified in Python).

Fork: obstore runs its requests on one tokio runtime per process, started by the first request;
a forked child inherits it without its threads and hangs on its first request (its own new
S3Store too). `runtime_inherited()` tells that case apart; `objstore.py` then reads through s3fs
in that child (fetch_client="auto") or raises (fetch_client="obstore"). A child of a process that
never made an obstore request starts its own runtime and is fine. A process that listed through
obstore (a dataset's construction) has started its runtime: its forked DataLoader workers read
through s3fs ("auto") unless the loader uses multiprocessing_context="spawn"/"forkserver".
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from ..forkguard import ForkGuard
from .policy import KeyNotNamable, ObjectChanged

#: s3fs storage_options that change nothing about a GET (listing caches, write and open() buffers,
#: s3fs's own concurrency, which objstore.py sets): the GETs may go through obstore with them.
_NOT_ABOUT_GETS = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths", "default_block_size",
                             "default_fill_cache", "default_cache_type", "skip_instance_cache", "max_concurrency",
                             "fixed_upload_size", "cache_regions", "version_aware"})
_MAPPED = frozenset({"endpoint_url", "key", "secret", "token", "anon", "client_kwargs", "requester_pays"})
_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key",
                            "aws_session_token", "verify"})
#: Variables obstore reads (object_store's AmazonS3Builder::from_env) that botocore does not read,
#: or reads differently, and that this mapping cannot override: set, the GETs stay with s3fs.
_OBSTORE_ONLY_ENV = ("AWS_ENDPOINT", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "AWS_SKIP_SIGNATURE", "AWS_UNSIGNED_PAYLOAD",
                     "AWS_S3_EXPRESS", "AWS_REQUEST_PAYER", "AWS_CHECKSUM_ALGORITHM", "AWS_SERVER_SIDE_ENCRYPTION",
                     "AWS_SSE_KMS_KEY_ID", "AWS_SSE_BUCKET_KEY_ENABLED", "AWS_SSE_CUSTOMER_KEY_BASE64",
                     "AWS_TOKEN", "AWS_IMDSV1_FALLBACK", "AWS_METADATA_ENDPOINT")

_started_in: ForkGuard | None = None  # the process whose first obstore request started its tokio runtime


def available() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def runtime_inherited() -> bool:
    """True in a forked child of a process that made obstore requests: obstore hangs here (see above)."""
    return _started_in is not None and _started_in.forked()


def s3_config(root: str, options: Mapping, environ: Mapping[str, str]) -> tuple[dict | None, str]:
    """(S3Store keyword arguments, "") for the bucket of `root` ("bucket/prefix") with these
    s3fs storage_options and environment, or (None, why not: names the option or variable, never
    a value). Credentials, endpoint and region are taken as botocore takes them: storage_options
    first, then AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_ENDPOINT_URL_S3 /
    AWS_ENDPOINT_URL, AWS_DEFAULT_REGION; botocore's other sources (profiles, credential files,
    instance roles) and the bucket-region lookup of s3fs are not obstore's: those stay with s3fs."""
    unknown = sorted(k for k in options if k not in _MAPPED and k not in _NOT_ABOUT_GETS)
    if unknown:
        return None, f"storage_options {unknown} have no obstore equivalent"
    ck = options.get("client_kwargs") or {}
    if not isinstance(ck, Mapping) or any(k not in _CLIENT_KWARGS for k in ck):
        return None, f"client_kwargs {sorted(k for k in ck if k not in _CLIENT_KWARGS)} have no obstore equivalent"
    env_only = [v for v in _OBSTORE_ONLY_ENV if environ.get(v)]
    if env_only:
        return None, f"environment variables {env_only} mean other things to obstore than to botocore"
    bucket = root.split("/", 1)[0]
    config: dict = {}
    client: dict = {}
    endpoint = (options.get("endpoint_url") or ck.get("endpoint_url") or environ.get("AWS_ENDPOINT_URL_S3")
                or environ.get("AWS_ENDPOINT_URL"))
    region = ck.get("region_name") or environ.get("AWS_DEFAULT_REGION")
    if not region and not endpoint:
        return None, "no region (client_kwargs.region_name or AWS_DEFAULT_REGION): s3fs looks the bucket's up"
    config["region"] = region or "us-east-1"  # botocore signs for us-east-1 too when an endpoint has none
    config["endpoint"] = endpoint or f"https://s3.{config['region']}.amazonaws.com"
    if str(config["endpoint"]).startswith("http://"):
        client["allow_http"] = True
    if ck.get("verify") is False:
        client["allow_invalid_certificates"] = True
    elif "verify" in ck and ck["verify"] is not True:
        return None, "client_kwargs.verify (a CA bundle) has no obstore equivalent"
    if options.get("anon"):
        config["skip_signature"] = True
    else:
        key = options.get("key") or ck.get("aws_access_key_id")
        secret = options.get("secret") or ck.get("aws_secret_access_key")
        token = options.get("token") or ck.get("aws_session_token")
        if not key and not secret:  # botocore: then the environment
            key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
            token = token or environ.get("AWS_SESSION_TOKEN")
        elif not token and environ.get("AWS_SESSION_TOKEN"):
            # obstore would add the environment's token to these keys; botocore does not
            return None, "AWS_SESSION_TOKEN is set but storage_options give key/secret without a token"
        if not key or not secret:
            return None, "credentials from botocore's chain (profile, credential file, instance role)"
        config.update(access_key_id=key, secret_access_key=secret)
        if token:
            config["session_token"] = token
    if options.get("requester_pays"):
        config["request_payer"] = True
    return {"bucket": bucket, "config": config, "client_options": client}, ""


def path_ok(path: str) -> bool:
    """Whether obstore can name this key (no empty, '.' or '..' segments); other keys go to s3fs."""
    return all(seg not in ("", ".", "..") for seg in path.split("/"))


class S3ServerError(ConnectionError):
    """The store answered 429 or 5xx (throttling, a server failure): retried."""


class S3RequestError(Exception):
    """The store refused the request for another reason (e.g. 416 range not satisfiable): final."""


_STATUS = re.compile(r"status code: (\d{3})([^:\n]*)")
_TIMED_OUT = "kind: Timeout,"  # in the debug dump of reqwest's timeout (connect, or the whole request)
_AUTH_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken")


def translate(err: BaseException) -> BaseException:
    """obstore's error as the kind `policy.classify` knows, with a one-line message."""
    from obstore import exceptions as oe

    text = str(err).split("\n\nDebug source:", 1)[0]
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    status = _STATUS.search(text)
    head = text.split("\n", 1)[0]
    if status:  # "HTTP 503 Service Unavailable: SlowDown (Please reduce your request rate.)"
        head = f"HTTP {status.group(1)}{status.group(2)}" + (f": {code.group(1)}" if code else "") + (
            f" ({message.group(1)})" if message else "")
    head = head[:400]
    if isinstance(err, oe.PreconditionError) or (status and status.group(1) == "412"):
        return ObjectChanged("HTTP 412 Precondition Failed: its ETag is no longer the listed one")
    if isinstance(err, oe.InvalidPathError):
        return KeyNotNamable(head)
    if isinstance(err, FileNotFoundError) or (status and status.group(1) == "404"):
        return FileNotFoundError(head)
    if isinstance(err, (oe.PermissionDeniedError, oe.UnauthenticatedError)) or (
            status and (status.group(1) in ("401", "403") or (code and code.group(1) in _AUTH_CODES))):
        return PermissionError(head)
    if status:
        n = int(status.group(1))
        return S3ServerError(head) if n == 429 or n >= 500 else S3RequestError(head)
    if isinstance(err, oe.GenericError) and _TIMED_OUT in str(err):  # the store's own whole-request timeout
        return TimeoutError()
    if isinstance(err, oe.GenericError):  # no HTTP answer: connection refused or reset, a timeout
        return ConnectionError(head)
    return err


def _started() -> None:
    global _started_in
    if _started_in is None:
        _started_in = ForkGuard()


def _s3store(kwargs: dict, seconds: float):
    from obstore.store import S3Store

    limit = datetime.timedelta(seconds=seconds)
    client: Any = {**kwargs["client_options"], "timeout": limit, "connect_timeout": limit}
    return S3Store(kwargs["bucket"], config=kwargs["config"], client_options=client,
                   retry_config={"max_retries": 0, "retry_timeout": limit})


#: Objects per chunk of obstore's list stream: S3's largest page (one chunk ~ one LIST request).
LIST_CHUNK = 1000


class ObstoreGetter:
    """One S3Store of this process (made here, never inherited), its GETs and listings. `get`
    (awaited on objstore.py's loop, which times each attempt out itself: `timeout` + 5 s is a
    backstop); `get_blocking` and the listings use a store whose own whole-request timeout is
    `timeout` (per HTTP request: per LIST page), reported as a bare TimeoutError as objstore.py's
    own timeout is."""

    def __init__(self, kwargs: dict, timeout: float) -> None:
        self.bucket = kwargs["bucket"]
        self.store = _s3store(kwargs, timeout + 5)
        self._kwargs, self._timeout, self._blocking = kwargs, timeout, None

    def get_blocking(self, path: str, etag: str | None = None) -> bytes:
        """The bytes of bucket/key `path`: one whole-object GET, on this thread (obstore's sync API:
        no asyncio loop, no Python future per step; ~half the client CPU of `get` per object).
        `etag` (the listed one): sent as If-Match; another ETag now raises ObjectChanged."""
        import obstore

        options = _if_match(etag)
        return self._blocking_call(lambda key: obstore.get(self._timed(), key, options=options).bytes(), path)

    def get_sized(self, path: str, size: int, etag: str | None = None) -> bytes | None:
        """`get_blocking` of an object listed with `size` (> 0) bytes: a GET of bytes [0, size], which
        obstore answers in one call (get_range) where a whole-object get takes two (its response, then
        its body): two fewer of the ~9 thread switches per object, ~20-30% less client CPU per GET.
        The store sends the whole object when it has `size` bytes or fewer (S3 cuts a range at the
        object's end); None when it has more (it grew since it was listed: GET it whole). With the
        listed `etag`, a GET with If-Match and a range (two calls, as `get`): another ETag now
        raises ObjectChanged."""
        import obstore

        if etag:
            options: Any = {**_if_match(etag), "range": (0, size + 1)}
            data = self._blocking_call(lambda key: obstore.get(self._timed(), key, options=options).bytes(), path)
        else:
            data = self._blocking_call(lambda key: obstore.get_range(self._timed(), key, start=0, end=size + 1), path)
        return None if len(data) > size else data

    @staticmethod
    def _blocking_call(call, path: str) -> bytes:
        failed = None
        try:
            return bytes(call(path.split("/", 1)[1]))
        except Exception as e:  # noqa: BLE001 (translated below, outside this block: no chained text)
            failed = translate(e)
        raise failed

    def _timed(self):
        """The store whose whole-request timeout is `timeout` (made on first use)."""
        _started()
        if self._blocking is None:
            self._blocking = _s3store(self._kwargs, self._timeout)
        return self._blocking

    async def list_pages(self, prefix: str, after: str | None):
        """Yield ([(key, size, ETag without quotes)], []) chunks of the objects below bucket key
        `prefix` + "/" (recursively, in key order), after key `after` (S3's StartAfter) if given."""
        import obstore

        stream = obstore.list(self._timed(), prefix or None, offset=after, chunk_size=LIST_CHUNK)
        while True:
            failed = None
            try:
                chunk = await stream.__anext__()
            except StopAsyncIteration:
                return
            except Exception as e:  # noqa: BLE001 (translated below, outside this block: no chained text)
                failed = translate(e)
            if failed is not None:
                raise failed
            yield [(m["path"], m["size"], _unquote(m["e_tag"])) for m in chunk], []

    async def get(self, path: str, start: int | None = None, end: int | None = None,
                  etag: str | None = None) -> bytes:
        """The bytes of bucket/key `path` (objstore.py's form), or [start, end) of them: one GET.
        `etag` (the listed one): sent as If-Match; another ETag now raises ObjectChanged."""
        import obstore

        _started()
        key = path.split("/", 1)[1]
        failed = None
        try:
            if start is None or etag:
                options: Any = _if_match(etag)
                if start is not None:
                    options["range"] = (start, end)
                result = await obstore.get_async(self.store, key, options=options)
                return bytes(await result.bytes_async())
            return bytes(await obstore.get_range_async(self.store, key, start=start, end=end))
        except Exception as e:  # noqa: BLE001 (translated below, outside this block: no chained text)
            failed = translate(e)
        raise failed


def _if_match(etag: str | None) -> Any:
    """obstore's GetOptions for a GET of the object only if its ETag is still `etag` (unquoted)."""
    return {"if_match": f'"{etag}"'} if etag else {}


def _unquote(etag: str | None) -> str | None:
    return etag.strip('"') if etag is not None else None


def runtime_started_here() -> bool:
    """Whether this process has started obstore's runtime (made a request)."""
    return _started_in is not None and _started_in.owner()
