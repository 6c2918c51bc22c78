"""Reading item bytes from object storage: any fsspec URL (s3:// through s3fs; gs://, az:// with
gcsfs, adlfs installed; file://, memory:// too).

    store = ObjectStore.from_url("s3://bucket/train", storage_options={"endpoint_url": ...})
    store.list_classes()            # ['class_a', 'class_b'], sorted
    store.list_tree()               # [ObjectInfo(key, size, etag), ...] under every class, listed in parallel
    store.read_many(keys)           # [bytes, ...]: concurrent GETs, at most max_in_flight at once
    store.stats()                   # {'requests', 'gets', 'lists', 'retries', 'bytes', 'objects'}

Every request has a timeout and is retried with exponential back-off and jitter on throttling
(S3's 503 SlowDown), 5xx, connection errors and timeouts; after the retries a `SampleError` names
the object's URL. Listings come in the order a local copy's walk gives (`walk_order_key`).

Which client GETs and lists s3:// objects (`fetch_client`, on `StoreConfig` and `from_url`; default:
the environment variable COORDL_S3_CLIENT for s3:// URLs, else "auto"):
- "obstore" (Rust; `pip install obstore`; ~0.5 ms of client CPU per GET against ~1.2 ms through
  s3fs/aiobotocore) for item reads: read_many, submit_many, read_ranges, and list_tree's class
  prefixes (parsed in Rust; botocore spends ~120 us of client CPU per listed object). While this
  process has not started obstore's runtime, list_tree lists in a forked child (listing.py),
  so that forked DataLoader workers can still GET through obstore. The root, list() and the error
  probes go through s3fs.
  storage_options map onto obstore's S3Store (`obstoreget.s3_config`): endpoint_url (or
  client_kwargs.endpoint_url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; http:// allowed), key/secret/
  token (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN), anon, requester_pays,
  client_kwargs.region_name (or AWS_DEFAULT_REGION), client_kwargs.verify=False. Options it cannot
  map are never dropped: "obstore" then raises ConfigError naming them, "auto" reads through s3fs.
- "s3fs": every request through s3fs.
- "auto": obstore when it is installed and the options map, else s3fs; `store.fetch_client` says
  which this process uses, `store.fetch_client_reason` why not obstore.
Both clients make one HTTP request per attempt and share the retries, timeouts, counters and
error messages below. s3:// listings go one ListObjectsV2 page per request, each page timed out and
retried alone (a prefix's retry resumes after its last key received); `lists` counts listing calls
(one per prefix and per retry). Other protocols list through fsspec's ls/find, one call per prefix
(its timeout covers the prefix; gs:// and az:// time out each request (page) inside gcsfs / the Azure
SDK, whose own retries are off, and the prefix's call only after 10 timeouts + 5 s, a backstop).
The root is listed once per construction (`check`).
submit_many's obstore GETs (the loaders' path) run one blocking GET per thread
on a pool of max_in_flight threads (the in-flight bound) instead of the event loop: obstore's async
API costs a Python future, a tokio blocking-pool thread and a loop wake-up per step (two steps per
GET), about twice the client CPU; there the timeout is obstore's own whole-request timeout, reported
as the loop's TimeoutError is, and a GET already sent is not cancelled (it ends within the timeout).
Keys obstore cannot name (an empty, '.' or '..' segment: `a//b.jpg`, `a/../b.jpg`) are GET through
s3fs, and a class prefix's listing that meets one goes on through s3fs from the last key received:
both clients list and read them, the same keys in the same order.
Credentials never appear in a message or a repr (`policy.redactor`, cache/redact.py). The policy (the
retry loop `Retries`, back-off, classification, the store's secrets) is pure and lives in `policy.py`;
this module is the I/O shell.

NOTE (lifecycle, threads and fork). Each ObjectStore owns, per process, one event-loop thread
(async filesystems run there, built with `asynchronous=True` on that loop and never taken from
fsspec's instance cache) and, for synchronous filesystems, a thread pool. Both are made on first
use in a process, so construction in the parent and use in a DataLoader worker both work:
- fork: the child finds its `ForkGuard` forked and builds its own loop thread, filesystem and pool; the
  parent's objects are parked in `_INHERITED` for the child's lifetime and never closed or
  collected there, because closing them would act on the parent's sockets and epoll instance
  (shared across fork) and stall the parent. Counters restart at zero in the child (they count
  this process's requests). Forked workers leave through os._exit, so nothing runs at exit.
- spawn/forkserver: the object pickles as (url, storage_options, config) and rebuilds lazily.
- close() (or garbage collection, in the owning process only) closes the session, stops the loop
  and joins its thread; a later call starts them again.
- obstore: a child builds its own S3Store, but obstore's tokio runtime (one per process) does not
  survive fork: in a child of a process that made obstore requests, "auto" reads through s3fs and
  "obstore" raises a ConfigError (use multiprocessing_context="spawn"/"forkserver"). A DataLoader
  whose parent only listed (s3fs) forks workers that each start their own runtime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, NamedTuple

from coordl.errors import ConfigError, DatasetError, SampleError

from ..forkguard import ForkGuard
from . import listing, obstoreget
from .policy import FETCH_CLIENT_ENV, Retries, StoreConfig, classify, redactor, walk_order_key

#: Per-process objects a forked child inherited from its parent: kept, never closed (see NOTE).
_INHERITED: list = []
_lock = threading.Lock()


def _reinit_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another parent thread may have held it at fork time


# Not a ForkGuard: a guard would replace the lock at its first use in the child, where two threads
# may both see it forked and make two locks; at_fork runs in the child before any thread exists.
os.register_at_fork(after_in_child=_reinit_lock_in_child)

#: Protocols whose first path component is a bucket (container): a missing root is told apart
#: as "no such bucket" vs "no such prefix".
_BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})
_COUNTERS = ("gets", "lists", "retries", "bytes", "objects")
#: Per protocol: (where the credentials come from, where the endpoint comes from), for error messages.
_WHERE = {
    "s3": ("storage_options key/secret (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
           "endpoint_url / AWS_ENDPOINT_URL"),
    "gs": ("storage_options token (a service-account JSON file, 'google_default', or 'anon' for a public bucket; "
           "or GOOGLE_APPLICATION_CREDENTIALS)", "endpoint_url / STORAGE_EMULATOR_HOST"),
    "az": ("storage_options connection_string, or account_name with account_key, sas_token or credential (or "
           "AZURE_STORAGE_CONNECTION_STRING)", "the connection_string's BlobEndpoint / account_name"),
}
_WHERE.update(s3a=_WHERE["s3"], gcs=_WHERE["gs"], abfs=_WHERE["az"], abfss=_WHERE["az"])
#: Protocols whose client `_one_attempt` configures (one attempt per request, each within the timeout).
_ONE_ATTEMPT = frozenset({"gs", "gcs", "az", "abfs", "abfss"})
#: azure.core's connection and socket-timeout errors (not retried by name in the policy), by class name.
_AZURE_CONNECTION = frozenset({"ServiceRequestError", "ServiceResponseError"})


def _as_builtin(err: Exception) -> Exception:
    """gcsfs's and the Azure SDK's errors the policy cannot tell by themselves, as the builtin error
    it classifies: a failed connection or socket timeout (azure.core) -> ConnectionError (retried);
    HTTP 401/403 (gcsfs's OSError('Forbidden: ...') or HttpError, Azure's HttpResponseError) ->
    PermissionError (denied: not retried). The message keeps the original class's name."""
    names = {cls.__name__ for cls in type(err).__mro__}
    status = getattr(err, "status_code", None) or getattr(err, "code", None)
    if names & _AZURE_CONNECTION:
        return ConnectionError(f"{type(err).__name__}: {err}")
    if status in (401, 403) or (type(err) is OSError and str(err).startswith("Forbidden: ")):
        return PermissionError(f"{type(err).__name__}: {err}")
    return err


class ObjectInfo(NamedTuple):
    """One object: its key relative to the store's root, its size in bytes, its ETag (None if the
    store has none)."""

    key: str
    size: int
    etag: str | None


class _Runtime:
    """The per-process half: an event loop on a daemon thread, the filesystem, a thread pool."""

    def __init__(self, make_fs, max_in_flight: int, make_getter=None) -> None:
        self.fork = ForkGuard()
        self.getter = make_getter() if make_getter is not None else None  # obstore GETs (s3:// only)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="coordl-objstore", daemon=True)
        self.thread.start()
        self.fs = make_fs(self.loop)
        self.pool = None if self.fs.async_impl else ThreadPoolExecutor(max_in_flight, "coordl-objstore")
        self.sem: asyncio.Semaphore | None = None  # the process-wide in-flight bound of submit_many
        # submit_many's obstore GETs: one blocking GET per thread, max_in_flight threads (the bound)
        self.gets = None if self.getter is None else ThreadPoolExecutor(max_in_flight, "coordl-obstore")
        self.counting = threading.Lock()  # the counters, added to from the loop and the GET threads

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Close the session, stop the loop, join the thread. Only in the process that made it."""
        if self.fork.forked():
            _INHERITED.append(self)  # a forked child collecting the parent's: park it, never close (NOTE)
            return
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(_close_session(self.fs), self.loop)
            try:
                fut.result(timeout=5)
            except Exception:  # noqa: BLE001 (best effort: a dead store must not block close)
                fut.cancel()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()
        for pool in (self.pool, self.gets):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


async def _close_session(fs) -> None:
    creator = getattr(fs, "_s3creator", None)  # s3fs (aiobotocore client context)
    if creator is not None:
        await creator.__aexit__(None, None, None)
    client = getattr(fs, "service_client", None)  # adlfs (azure.storage.blob.aio), and its credential
    if client is not None:
        for closable in (client, getattr(fs, "credential", None)):
            result = getattr(closable, "close", lambda: None)()
            if asyncio.iscoroutine(result):
                await result
        # adlfs's own closers (weakref.finalize(fs, sync, fs.loop, ...)) get loop None from an
        # asynchronous=True filesystem and would raise 'Loop is not running' at exit: detached
        for f in list(getattr(weakref.finalize, "_registry", {})):
            if (info := f.peek()) is not None and info[0] is fs:
                f.detach()
    session = getattr(fs, "_session", None)  # gcsfs, fsspec http (aiohttp session)
    close = getattr(session, "close", None)
    if close is not None:
        result = close()
        if asyncio.iscoroutine(result):
            await result


def _one_attempt(fs, protocol: str, options: dict, timeout: float) -> None:
    """One attempt per request inside gcsfs and the Azure SDK, each request within `timeout` (unless
    storage_options pass requests_timeout / connection_timeout / read_timeout): coordl retries, backs
    off and counts. Left on, gcsfs retried 5xx and connection errors itself up to 6 times (sleeps of
    1 to 17 s) and the Azure SDK 3 times (sleeps of 15 s and more), hidden from storage_retries, and a
    killed store took every attempt's whole timeout (4 x 10 s). adlfs's find swallows a cancellation
    (a bare except in _isfile) and goes on listing: only the SDK's own timeouts (60 s per read, each
    retried) ended it, 327 s for a silent store at timeout=1."""
    if protocol in ("gs", "gcs"):
        unwrapped = getattr(type(fs)._request, "__wrapped__", None)  # @retry_request(retries=6)
        if unwrapped is not None:
            fs._request = functools.partial(unwrapped, fs)
        return
    config = getattr(getattr(fs, "service_client", None), "_config", None)  # adlfs: azure.storage.blob.aio
    if protocol not in ("az", "abfs", "abfss") or config is None:
        return
    if hasattr(config.retry_policy, "total_retries"):
        config.retry_policy.total_retries = 0  # one policy object, shared by its container and blob clients
    connection = getattr(config.transport, "connection_config", None)
    if connection is not None:
        connection.timeout = options.get("connection_timeout", timeout)
        connection.read_timeout = options.get("read_timeout", timeout)


def _blob_endpoint(connection_string: str) -> str | None:
    """The BlobEndpoint of an Azure connection string (adlfs's connection_string), e.g. Azurite's."""
    for part in connection_string.split(";"):
        name, _, value = part.strip().partition("=")
        if name.lower() == "blobendpoint" and value:
            return value
    return None


def _json_api_class(fs_cls: type, protocol: str, options: dict) -> type:
    """gcsfs's core GCSFileSystem for gs:// at a custom endpoint (endpoint_url, STORAGE_EMULATOR_HOST):
    the class fsspec names (gcsfs.GCSFileSystem: gcsfs's ExtendedGcsFileSystem by default) first asks
    each bucket's layout through the gRPC Storage Control API, again on every call until it answers, and
    an emulator of the JSON API (gcp-storage-emulator, fake-gcs-server) never does (a 60 s timeout per
    call). coordl only lists and GETs, which the JSON API serves for every bucket."""
    if protocol not in ("gs", "gcs") or not (options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")):
        return fs_cls
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem


class ObjectStore:
    """Objects under one URL prefix, read concurrently with retries. See the module docstring."""

    def __init__(self, url: str, storage_options: dict | None = None, config: StoreConfig | None = None,
                 check: bool = True) -> None:
        import fsspec

        if not isinstance(url, str) or not url:
            raise ConfigError(f"ObjectStore url={url!r} is not a URL: pass e.g. 's3://bucket/prefix'")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise ConfigError(f"storage_options must be a dict or None, not {type(storage_options).__name__}")
        self._url, self._options = url.rstrip("/"), dict(storage_options or {})
        self._config = config or StoreConfig()
        self._redact = redactor(self._options)
        protocol, _ = fsspec.core.split_protocol(self._url)
        self._protocol = protocol or "file"
        try:
            self._fs_cls = fsspec.get_filesystem_class(self._protocol)
        except (ImportError, ValueError) as e:
            raise ConfigError(f"{self.url}: no filesystem for {self._protocol}:// ({self._redact(str(e))}): "
                              f"install it (s3: pip install -e '.[s3]'; gs: gcsfs; az: adlfs)") from None
        self._fs_cls = _json_api_class(self._fs_cls, self._protocol, self._options)
        self._root = self._fs_cls._strip_protocol(self._url).rstrip("/")
        self._url_options = self._fs_cls._get_kwargs_from_urls(self._url)
        self._rng = random.Random()
        self._runtime: _Runtime | None = None
        self._counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._obstore, self._why_not = self._choose_client()
        self._root_classes: list[str] | None = None  # the construction's listing of the root, for list_classes
        if check:
            self._check_root()

    @classmethod
    def from_url(cls, url: str, storage_options: dict | None = None, *, max_in_flight: int = 32,
                 timeout: float = 10.0, retries: int = 3, check: bool = True,
                 fetch_client: str | None = None) -> ObjectStore:
        """The store at `url`; with `check`, lists the root now and raises a coordl error naming the URL
        and the fix for a missing bucket or prefix, bad credentials or an unreachable endpoint.
        `fetch_client`: "auto", "obstore" or "s3fs" (see the module docstring; None: $COORDL_S3_CLIENT for
        an s3:// URL, "auto" for others; an explicit "obstore" with another protocol raises ConfigError)."""
        config = StoreConfig(max_in_flight=max_in_flight, timeout=timeout, retries=retries)
        if fetch_client is None and isinstance(url, str) and not url.startswith(("s3://", "s3a://")):
            fetch_client = "auto"  # $COORDL_S3_CLIENT names the client of s3:// URLs only
        if fetch_client is not None:
            config = dataclasses.replace(config, fetch_client=fetch_client)
        return cls(url, storage_options, config, check=check)

    def _choose_client(self) -> tuple[dict | None, str]:
        """(S3Store arguments, "") when GETs go through obstore, else (None, why not)."""
        want = self._config.fetch_client
        if want == "s3fs":
            return None, "fetch_client='s3fs'"
        if self._protocol not in ("s3", "s3a"):
            why = f"obstore reads only s3:// here, not {self._protocol}://"
        elif not obstoreget.available():
            why = "obstore is not installed (pip install obstore)"
        else:
            kwargs, why = obstoreget.s3_config(self._root, self._options, os.environ)
            if kwargs is not None:
                return kwargs, ""
        if want == "obstore":
            raise ConfigError(f"{self.url}: fetch_client='obstore' (or {FETCH_CLIENT_ENV}=obstore) cannot be used: "
                              f"{why}: pass fetch_client='auto' or 's3fs', or change these options")
        return None, why

    @property
    def fetch_client(self) -> str:
        """The client of this process's GETs: 'obstore', 's3fs' (s3://) or 'fsspec' (other protocols)."""
        if self._obstore is None:
            return "s3fs" if self._protocol in ("s3", "s3a") else "fsspec"
        return "obstore" if self._rt().getter is not None else "s3fs"

    @property
    def fetch_client_reason(self) -> str:
        """Why this process's GETs do not go through obstore ("" when they do)."""
        if self._obstore is not None and self._rt().getter is None:
            return "obstore's runtime did not survive fork: this child of a process that used it reads through s3fs"
        return self._why_not

    # -- naming, without secrets --

    @property
    def url(self) -> str:
        """The root URL, credentials removed."""
        return self._redact(self._url)

    @property
    def config(self) -> StoreConfig:
        return self._config

    def url_of(self, key: str) -> str:
        """The URL of the object `key` (relative to the root), credentials removed."""
        return f"{self.url}/{key}"

    def endpoint(self) -> str:
        """The endpoint the store talks to, credentials removed (or "the default endpoint")."""
        opts = self._options
        endpoint = (opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
                    or (os.environ.get("AWS_ENDPOINT_URL") if self._protocol in ("s3", "s3a") else None)
                    or (os.environ.get("STORAGE_EMULATOR_HOST") if self._protocol in ("gs", "gcs") else None)
                    or _blob_endpoint(opts.get("connection_string") or ""))
        return self._redact(endpoint) if endpoint else "the default endpoint"

    def _where(self) -> tuple[str, str]:
        return _WHERE.get(self._protocol, ("storage_options", "storage_options"))

    def __repr__(self) -> str:
        c = self._config
        return (f"ObjectStore({self.url!r}, endpoint={self.endpoint()!r}, max_in_flight={c.max_in_flight}, "
                f"timeout={c.timeout}, retries={c.retries}, fetch_client={c.fetch_client!r})")

    def _make_getter(self):
        """This process's obstore client, or None (s3fs GETs) in a forked child of a process that used
        obstore (NOTE), where fetch_client='obstore' raises instead."""
        if self._obstore is None:
            return None
        if obstoreget.runtime_inherited():
            if self._config.fetch_client == "obstore":
                raise ConfigError(f"{self.url}: fetch_client='obstore' in a process forked from one that made obstore "
                                  "requests, whose runtime does not survive fork: create the DataLoader with "
                                  "multiprocessing_context='spawn' or 'forkserver', or pass fetch_client='auto'")
            return None
        return obstoreget.ObstoreGetter(self._obstore, self._config.timeout)

    # -- per-process runtime (fork guard) --

    def _make_fs(self, loop):
        opts: dict[str, Any] = {**self._url_options, "use_listings_cache": False}
        c = self._config
        if self._protocol in ("s3", "s3a"):
            # one attempt per call in s3fs and botocore: retries, timeouts and their counts are ours
            config_kwargs = {"max_pool_connections": c.max_in_flight, "connect_timeout": c.timeout,
                             "read_timeout": c.timeout, "retries": {"total_max_attempts": 1, "mode": "standard"},
                             **self._options.get("config_kwargs", {})}
            opts.update(max_concurrency=1, config_kwargs=config_kwargs)
        opts.update({k: v for k, v in self._options.items() if k != "config_kwargs"})
        opts["skip_instance_cache"] = True
        if self._fs_cls.async_impl:
            opts.update(asynchronous=True, loop=loop)
        if self._protocol in ("gs", "gcs"):
            opts.setdefault("requests_timeout", c.timeout)  # aiohttp's, per request (a listing: per page)
        fs = self._fs_cls(**opts)
        if self._protocol in ("s3", "s3a"):
            fs.retries = 1  # s3fs's own retry loop (a class attribute): one attempt
        _one_attempt(fs, self._protocol, self._options, c.timeout)
        return fs

    def _rt(self) -> _Runtime:
        rt = self._runtime
        if rt is not None and rt.fork.owner():
            return rt
        with _lock:
            rt = self._runtime
            if rt is not None and rt.fork.forked():  # forked: park the parent's, start afresh
                _INHERITED.append(rt)
                self._runtime = rt = None
                self._counts = dict.fromkeys(_COUNTERS, 0)
            if rt is None:
                rt = self._runtime = _Runtime(self._make_fs, self._config.max_in_flight, self._make_getter)
                weakref.finalize(self, rt.close)
            return rt

    def close(self) -> None:
        """Stop this process's loop thread and pool and close the session (a later call restarts them)."""
        rt, self._runtime = self._runtime, None
        if rt is not None:
            rt.close()

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {"url": self._url, "storage_options": self._options, "config": self._config}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["url"], state["storage_options"], state["config"], check=False)

    # -- counters --

    def stats(self) -> dict[str, int]:
        """This process's counts: requests (= gets + lists, retries included), gets (GET attempts),
        lists (listing calls), retries, bytes (of objects read), objects (objects read)."""
        counts = dict(self._counts)
        return {"requests": counts["gets"] + counts["lists"], **counts}

    def _add(self, rt: _Runtime, **counts: int) -> None:
        with rt.counting:
            for name, n in counts.items():
                self._counts[name] += n

    # -- one request, with retries --

    async def _call(self, rt: _Runtime, name: str, *args, **kwargs):
        etag = kwargs.pop("etag", None)  # cat_file: the listed ETag, sent as If-Match (s3://)
        if name == "cat_file" and rt.getter is not None and obstoreget.path_ok(args[0]):
            return await rt.getter.get(args[0], kwargs.get("start"), kwargs.get("end"), etag)
        fs = rt.fs
        if name == "cat_file" and etag and hasattr(fs, "_call_s3"):
            return await listing.s3fs_get(fs, args[0], kwargs.get("start"), kwargs.get("end"), etag)
        if fs.async_impl:
            return await getattr(fs, "_" + name)(*args, **kwargs)
        return await rt.loop.run_in_executor(rt.pool, lambda: getattr(fs, name)(*args, **kwargs))

    async def _attempts(self, rt: _Runtime, sem: asyncio.Semaphore, counter: Literal["gets", "lists"], name: str,
                        path: str, wait: float | None = None, **kwargs) -> tuple[Any, BaseException | None, int]:
        """(result, None, attempts) or (None, the last error, attempts): `name` on `path`, each attempt
        within `wait` seconds (default: the timeout), retried as the policy says. Errors are returned,
        not raised, so the caller raises its own outside any `except` block (no chained exception
        carrying the backend's text)."""
        retries = Retries(self._config, self._rng)
        while True:
            retries.next_attempt()
            async with sem:
                self._add(rt, **{counter: 1})
                try:
                    result = await asyncio.wait_for(self._call(rt, name, path, **kwargs), wait or self._config.timeout)
                    return result, None, retries.attempts
                except Exception as e:  # noqa: BLE001 (any backend's error; classified below)
                    err = _as_builtin(e)
            pause = retries.after(err)
            if pause is None:
                return None, err, retries.attempts
            self._add(rt, retries=1)
            await asyncio.sleep(pause)

    def _describe(self, err: BaseException) -> str:
        text = str(err) or (f"no answer within timeout={self._config.timeout} s"
                            if isinstance(err, TimeoutError) else "")
        return f"{type(err).__name__}: {self._redact(text)[:300]}".rstrip(": ")

    def _sample_error(self, key: str, err: BaseException, attempts: int) -> SampleError:
        kind = classify(err)
        fix = {
            "missing": "the object was deleted or renamed after the dataset was listed: restore it, or list "
                       "the dataset again (rescan=True)",
            "changed": "the object changed after the dataset was listed (a loader serves the dataset as listed "
                       "when it was built): build the dataset again to read the new bytes, or pass "
                       "on_error='skip'",
            "denied": f"the credentials may not read it: check {self._where()[0]} and the bucket's policy",
            "retry": f"the store at {self.endpoint()} is throttling, failing or unreachable: check it is up, "
                     f"or pass a larger timeout/retries or a smaller max_in_flight",
        }.get(kind, "check the object and the store")
        if kind == "changed":
            return SampleError(f"{self.url_of(key)}: changed since it was listed ({self._describe(err)}): {fix}")
        return SampleError(f"{self.url_of(key)}: GET failed after {attempts} attempt(s) ({self._describe(err)}): "
                           f"{fix}")

    # -- reading --

    def read_many(self, keys: Sequence[str], return_errors: bool = False) -> list:
        """The bytes of each object `keys[i]` (keys relative to the root), fetched concurrently with at
        most `max_in_flight` requests at once. A failure after the retries raises SampleError naming
        the object's URL (the other requests are cancelled); with `return_errors`, its slot holds the
        SampleError instead and the others complete."""
        keys = list(keys)
        if not keys:
            return []
        rt = self._rt()
        return rt.run(self._read_all(rt, keys, return_errors))

    def submit_many(self, keys: Sequence[str], on_attempts: Callable[[int], None] | None = None,
                    sizes: Sequence[int] | None = None, etags: Sequence[str | None] | None = None) -> list:
        """Start reading each object `keys[i]` now and return at once: one `concurrent.futures.Future`
        per key, whose result is the bytes or raises the SampleError naming the object's URL. All the
        reads of this process (every call) share one bound of `max_in_flight` requests in flight, so a
        caller may decode what has arrived while the rest are still in flight. `on_attempts(n)` is
        called once per key, on the store's thread and before its future completes, with the GET
        requests it took (1 + its retries). `sizes[i]`, the object's size when it was listed, lets
        obstore read it with one call instead of two (`ObstoreGetter.get_blocking`); an object that
        has grown since is read again whole, a second request counted as a retry. `etags[i]`, the
        object's ETag when it was listed (s3://, both clients): each GET is sent with If-Match, and an
        object rewritten since fails with a SampleError saying it changed (never its new bytes)."""
        rt = self._rt()
        if rt.sem is None:
            rt.sem = asyncio.Semaphore(self._config.max_in_flight)
        tags = etags if etags is not None else [None] * len(keys)
        if rt.gets is not None:  # obstore: each GET on a thread of rt.gets (its size is the bound)
            sized = sizes if sizes is not None else [None] * len(keys)
            return [rt.gets.submit(self._read_blocking, rt, rt.sem, k, on_attempts, n, e)
                    for k, n, e in zip(keys, sized, tags)]
        return [asyncio.run_coroutine_threadsafe(self._read_or_raise(rt, rt.sem, k, on_attempts, e), rt.loop)
                for k, e in zip(keys, tags)]

    def _read_blocking(self, rt: _Runtime, sem: asyncio.Semaphore, key: str,
                       on_attempts: Callable[[int], None] | None, size: int | None = None,
                       etag: str | None = None) -> bytes:
        """submit_many's read of one object on a thread of rt.gets: `_read_or_raise` with obstore's
        blocking GET (same retries, back-off, counters and errors; the timeout is the store's own)."""
        path, getter = f"{self._root}/{key}", rt.getter
        if getter is None or not obstoreget.path_ok(path):  # s3fs on the loop; this thread holds the slot
            return asyncio.run_coroutine_threadsafe(self._read_or_raise(rt, sem, key, on_attempts, etag),
                                                    rt.loop).result()
        retries, err, again = Retries(self._config, self._rng), None, 0
        while True:
            retries.next_attempt()
            self._add(rt, gets=1)
            try:
                sized = size is not None and size > 0
                got = getter.get_sized(path, size, etag) if sized else getter.get_blocking(path, etag)
                if got is None:  # more than `size` bytes: it grew since it was listed; GET it whole
                    self._add(rt, gets=1, retries=1)
                    again, size = 1, None
                    got = getter.get_blocking(path, etag)
                data = got
            except Exception as e:  # noqa: BLE001 (classified below)
                err = e
            else:
                err = None
                break
            pause = retries.after(err)
            if pause is None:
                break
            self._add(rt, retries=1)
            time.sleep(pause)
        if err is None:
            self._add(rt, bytes=len(data), objects=1)
        if on_attempts is not None:
            on_attempts(retries.attempts + again)
        if err is not None:
            raise self._sample_error(key, err, retries.attempts + again)
        return data

    async def _read_or_raise(self, rt: _Runtime, sem: asyncio.Semaphore, key: str,
                             on_attempts: Callable[[int], None] | None = None, etag: str | None = None) -> bytes:
        data, attempts = await self._read_counted(rt, sem, key, etag)
        if on_attempts is not None:
            on_attempts(attempts)
        if isinstance(data, SampleError):
            raise data
        return data

    def read(self, key: str) -> bytes:
        """The bytes of one object (one GET, with retries)."""
        return self.read_many([key])[0]

    def read_ranges(self, ranges: Sequence[tuple[str, int, int]], return_errors: bool = False,
                    on_attempts: Callable[[int], None] | None = None,
                    etags: Sequence[str | None] | None = None) -> list:
        """The bytes [offset, offset + length) of object `key` for each (key, offset, length): one ranged
        GET each (counted in `gets` and `bytes`, not `objects`; none for a length of 0), concurrently with at most
        `max_in_flight` at once in this process (one bound with submit_many and every other read_ranges call:
        WebDataset reads a batch ahead while it reads one) and `read_many`'s retries. A failure raises (with
        `return_errors`: fills its slot with) a SampleError naming the object's URL; a range past the object's
        end comes back short, for the caller to check. `on_attempts(n)` is called once per range that sent a
        request, on the store's thread before this returns, with the GET requests it took (1 + its retries),
        so a caller (WebDataset) counts exactly the requests of its own call. `etags[i]`: the listed
        ETag of range i's object, sent as If-Match (s3://): a SampleError says the object changed."""
        ranges = [(k, int(o), int(n)) for k, o, n in ranges]
        tags = list(etags) if etags is not None else [None] * len(ranges)
        if not ranges:
            return []
        rt = self._rt()

        async def go() -> list:
            if rt.sem is None:  # (on the loop's thread, as submit_many's s3fs GETs use it)
                rt.sem = asyncio.Semaphore(self._config.max_in_flight)
            sem = rt.sem
            out = await asyncio.gather(*(self._read_range(rt, sem, k, o, n, on_attempts, e)
                                         for (k, o, n), e in zip(ranges, tags)))
            failed = [r for r in out if isinstance(r, SampleError)]
            if failed and not return_errors:
                raise failed[0]
            return list(out)

        return rt.run(go())

    async def _read_range(self, rt: _Runtime, sem: asyncio.Semaphore, key: str, offset: int, length: int,
                          on_attempts: Callable[[int], None] | None = None, etag: str | None = None):
        if length <= 0:  # no request: s3fs would send "bytes=o-(o-1)", which servers answer with the whole object
            return b""
        data, err, attempts = await self._attempts(rt, sem, "gets", "cat_file", f"{self._root}/{key}",
                                                   start=offset, end=offset + length, etag=etag)
        if on_attempts is not None:
            on_attempts(attempts)
        if err is not None:
            return self._sample_error(key, err, attempts)
        self._add(rt, bytes=len(data))
        return data

    async def _read_one(self, rt: _Runtime, sem: asyncio.Semaphore, key: str):
        return (await self._read_counted(rt, sem, key))[0]

    async def _read_counted(self, rt: _Runtime, sem: asyncio.Semaphore, key: str,
                            etag: str | None = None) -> tuple[Any, int]:
        """(the bytes or the SampleError, the GET attempts made); `etag`: sent as If-Match (s3://)."""
        data, err, attempts = await self._attempts(rt, sem, "gets", "cat_file", f"{self._root}/{key}", etag=etag)
        if err is not None:
            return self._sample_error(key, err, attempts), attempts
        self._add(rt, bytes=len(data), objects=1)
        return data, attempts

    async def _read_all(self, rt: _Runtime, keys: list[str], return_errors: bool) -> list:
        sem = asyncio.Semaphore(self._config.max_in_flight)
        tasks = [asyncio.ensure_future(self._read_one(rt, sem, k)) for k in keys]
        if return_errors:
            return list(await asyncio.gather(*tasks))
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed = [t.result() for t in done if isinstance(t.result(), SampleError)]
            if failed:
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                raise failed[0]
        return [t.result() for t in tasks]

    # -- listing --

    def _list_error(self, path: str, err: BaseException, attempts: int) -> Exception:
        where = f"{self._protocol}://{path}" if self._protocol != "file" else path
        where = self._redact(where)
        kind, what = classify(err), self._describe(err)
        if kind == "denied" or type(err).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            s3 = self._protocol.startswith("s3")
            anon = "; for a public bucket pass storage_options={'anon': True}" if s3 else ""
            return ConfigError(f"{where}: access denied ({what}): check the credentials: {self._where()[0]}, and "
                               f"that they may list this bucket{anon}")
        if kind == "missing":
            return DatasetError(f"{where}: not found ({what}): check the URL; list it with your store's "
                                "client (e.g. aws s3 ls) against the same endpoint")
        if kind != "retry":  # the store answered: the endpoint is not to blame
            return DatasetError(f"{where}: listing failed ({what}): check the listed keys and the URL")
        return DatasetError(f"{where}: listing failed after {attempts} attempt(s) ({what}): check that "
                            f"{self.endpoint()} is reachable ({self._where()[1]}) and up")

    def _run_listing(self, name: str, path: str, **kwargs):
        rt = self._rt()

        async def go():
            return await self._attempts(rt, asyncio.Semaphore(1), "lists", name, path, **kwargs)

        result, err, attempts = rt.run(go())
        if err is not None:
            raise self._list_error(path, err, attempts)
        return result

    def _pages_s3(self) -> bool:
        """Whether listings go page by page (s3:// through s3fs or obstore), else through fsspec's ls/find.
        Makes s3fs's client first: its making (botocore's models, seconds on a busy machine the first
        time in a process) is not a request, and is not timed as one."""
        rt = self._rt()
        if self._protocol not in ("s3", "s3a") or not hasattr(rt.fs, "_call_s3"):
            return False
        rt.run(rt.fs.set_session())
        return True

    async def _list_pages(self, rt: _Runtime, sem: asyncio.Semaphore, source, resumable: bool, wait: float):
        """(objects, prefixes, None, attempts) or ([], [], the last error, attempts): every page of
        `source` (listing.py), each awaited within `wait` seconds and retried as the policy
        says. `resumable`: a retry resumes after the last key received, and each page has its own
        retries; else (a delimiter listing: the root) it starts again. Counts one `lists` per
        listing call (the first, then each retry), as fsspec's whole-prefix calls were counted."""
        objects, prefixes, after, retries = [], [], None, Retries(self._config, self._rng)
        while True:
            retries.next_attempt()
            async with sem:
                self._add(rt, lists=1)
                pages, err = source(after), None
                try:
                    while True:
                        try:
                            objs, prefs = await asyncio.wait_for(pages.__anext__(), wait)
                        except StopAsyncIteration:
                            return objects, prefixes, None, retries.attempts
                        objects += objs
                        prefixes += prefs
                        if resumable and objs:
                            after = objs[-1][0]
                            retries.progress()
                except Exception as e:  # noqa: BLE001 (any backend's error; classified below)
                    err = e
                finally:
                    await pages.aclose()
            pause = retries.after(err)
            if pause is None:
                return [], [], err, retries.attempts
            self._add(rt, retries=1)
            if not resumable:
                objects, prefixes = [], []
            await asyncio.sleep(pause)

    def _list_root(self) -> tuple[list[str], BaseException | None, int]:
        """(the class names, sorted, None, attempts) or ([], the error, attempts): one listing of the root."""
        rt = self._rt()
        if not self._pages_s3():
            entries, err, attempts = rt.run(self._attempts(rt, asyncio.Semaphore(1), "lists", "ls", self._root,
                                                           detail=True))
            if err is not None:
                return [], err, attempts
            return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries
                          if e.get("type") == "directory"), None, attempts
        bucket, prefix = listing.prefix_of(self._root)

        def source(after):
            return listing.s3fs_pages(rt.fs, bucket, prefix, "/", after)

        objects, prefixes, err, attempts = rt.run(self._list_pages(rt, asyncio.Semaphore(1), source, False,
                                                                   self._config.timeout))
        if err is None and prefix and not objects and not prefixes:
            err = FileNotFoundError(f"{self._root}: no object below it")  # as s3fs's ls
        if err is not None:
            return [], err, attempts
        return sorted(p[len(prefix):] for p in prefixes), None, attempts

    def _check_root(self) -> None:
        """Raise at construction, naming the URL and the fix, when the root cannot be listed. Its
        listing serves the first `list_classes()` (the root is listed once per construction)."""
        rt = self._rt()

        async def probe(path):
            return await self._attempts(rt, asyncio.Semaphore(1), "lists", "ls", path, detail=False)

        classes, err, attempts = self._list_root()
        if err is None:
            self._root_classes = classes
            return
        bucket, _, prefix = self._root.partition("/")
        if classify(err) == "missing" and self._protocol in _BUCKET_PROTOCOLS:
            if prefix and rt.run(probe(bucket))[1] is None:
                raise DatasetError(f"{self.url}: no objects under prefix {prefix!r} in bucket {bucket!r}: check "
                                   f"the path (class folders are the first-level prefixes below it)")
            raise DatasetError(f"{self.url}: bucket {bucket!r} does not exist at {self.endpoint()} (or these "
                               "credentials may not see it): check the bucket name, endpoint_url and region")
        raise self._list_error(self._root, err, attempts)

    def list_classes(self) -> list[str]:
        """The first-level prefixes under the root (the class folders), sorted. The first call after
        construction (with `check`) answers from the construction's listing of the root."""
        classes, self._root_classes = self._root_classes, None
        if classes is not None:
            return classes
        classes, err, attempts = self._list_root()
        if err is not None:
            raise self._list_error(self._root, err, attempts)
        return classes

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under root/prefix (recursively), in walk order (`walk_order_key`)."""
        path = f"{self._root}/{prefix.strip('/')}" if prefix.strip("/") else self._root
        found = self._run_listing("find", path, detail=True)
        return self._infos(found)

    def list_tree(self, classes: Sequence[str] | None = None) -> list[ObjectInfo]:
        """Every object under each class prefix (default: `list_classes()`), the prefixes listed
        concurrently (max_in_flight at once), in walk order. Objects directly under the root are not
        in any class and are left out, as a local ImageFolder leaves out files beside the class folders.
        s3:// goes page by page (each page timed out and retried alone), through obstore when the GETs
        are (in a forked child while this process has not started obstore's runtime, so that its
        forked DataLoader workers can still use obstore; see listing.py), else through s3fs."""
        classes = self.list_classes() if classes is None else list(classes)
        rt = self._rt()
        if not self._pages_s3():
            return self._find_tree(rt, classes)
        if rt.getter is None or obstoreget.runtime_started_here():
            return self._page_tree(rt, classes)
        found, counts = listing.in_forked_child(lambda: self._page_tree_counted(classes),
                                                f"{self.url}: listing the class prefixes")
        self._add(rt, **counts)
        return [ObjectInfo(key, size, etag) for key, size, etag in found]

    def list_images(self, extensions: Sequence[str]) -> tuple[list[str], list[ObjectInfo], list[int]]:
        """(the class prefixes, sorted; the objects below them whose key ends in one of `extensions`
        (lower case), in walk order; how many of them in each class): an ImageFolder's listing."""
        classes = self.list_classes()
        kept, counts = listing.select_images(self.list_tree(classes), classes, tuple(extensions))
        return classes, kept, counts

    def _page_tree_counted(self, classes: list[str]) -> tuple[list[list], dict[str, int]]:
        """(list_tree's objects as [key, size, etag], the lists and retries it took): the work of
        in_forked_child (plain data: it crosses a pipe as msgpack)."""
        found = self._page_tree(self._rt(), classes)
        return [list(o) for o in found], {k: self._counts[k] for k in ("lists", "retries")}

    def _page_tree(self, rt: _Runtime, classes: list[str]) -> list[ObjectInfo]:
        getter, fs = rt.getter, rt.fs

        def source_of(c: str) -> tuple[Callable, float]:
            """(the page source of class prefix c, the seconds one page may take: obstore's own timeout
            is per request, the wait a backstop for a chunk of several pages; s3fs: one page)."""
            bucket, prefix = listing.prefix_of(self._root, c)
            def s3fs(after):
                return listing.s3fs_pages(fs, bucket, prefix, None, after)

            if getter is not None and obstoreget.path_ok(f"{bucket}/{prefix[:-1]}"):
                lister = getter
                source = listing.falling_back(lambda after: lister.list_pages(prefix[:-1], after), s3fs)
                return source, self._config.timeout * 10 + 5
            return s3fs, self._config.timeout

        async def go():
            sem = asyncio.Semaphore(self._config.max_in_flight)
            sources = [source_of(c) for c in classes]
            return await asyncio.gather(*(self._list_pages(rt, sem, source, True, wait) for source, wait in sources))

        out, start = [], len(listing.prefix_of(self._root)[1])
        for c, (objects, _, err, attempts) in zip(classes, rt.run(go())):
            if err is not None:
                raise self._list_error(f"{self._root}/{c}", err, attempts)
            out += [ObjectInfo(k[start:], s, e) for k, s, e in objects]
        out.sort(key=lambda o: walk_order_key(o.key))
        return out

    def _find_tree(self, rt: _Runtime, classes: list[str]) -> list[ObjectInfo]:
        """list_tree through fsspec's find, one call per class prefix (gs://, az://, file://, ...). gcsfs
        and adlfs time out each request (a page) themselves (`_one_attempt`): a prefix's call may take
        ten timeouts (a backstop) before it is retried; other filesystems, one timeout."""
        timeout = self._config.timeout
        wait = timeout * 10 + 5 if self._protocol in _ONE_ATTEMPT else timeout

        async def go():
            sem = asyncio.Semaphore(self._config.max_in_flight)
            return await asyncio.gather(*(self._attempts(rt, sem, "lists", "find", f"{self._root}/{c}", wait,
                                                         detail=True) for c in classes))

        found: dict = {}
        for c, (result, err, attempts) in zip(classes, rt.run(go())):
            if err is not None:
                raise self._list_error(f"{self._root}/{c}", err, attempts)
            found.update(result)
        return self._infos(found)

    def _infos(self, found: dict) -> list[ObjectInfo]:
        start = len(self._root) + 1
        out = []
        for name, info in found.items():
            if info.get("type") == "directory":
                continue
            etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation")
            out.append(ObjectInfo(name[start:], int(info.get("size") or 0), listing.unquote(etag)))
        out.sort(key=lambda o: walk_order_key(o.key))
        return out
