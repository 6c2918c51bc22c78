"""Messages between the coordinator daemon, its jobs and its prep workers.

A message is one frame: a 4-byte big-endian length, then a msgpack map with a
``"type"`` key and the message's fields. Nothing is ever pickled, and batch
data never travels here: it lies in the ring (see ring.py); a message only
names a slot. Every message is a small frozen dataclass; decoding checks the
type name against the set the receiver accepts, the field names and each
field's type (a ``list[int]`` field item by item; a ``dict`` field, StatusReply.status
and PrepDone.counters, as a map only, not what it holds) and the values a message
checks itself (a failure's kind, a sample spec's dtype and shape), and raises `ProtocolError` for
anything else. From a job, a malformed or oversized frame costs the daemon
that one connection, never the process; from one of its own prep workers it
is a bug, and the daemon stops with a `CoordinatorError` (daemon.py
``_on_worker``) rather than serve batches it cannot trust.

Who sends what (request -> reply):

    job -> daemon      Hello        -> Welcome | Refused
                       Resume       -> Resumed | Refused         (before the first Begin: move
                                                                  to a checkpoint's batch)
                       Begin        -> EpochStart | Refused      (start the job's next epoch)
                       Next(count)  -> count x (Ready | BatchFailed (a `Failure`)), in batch
                                       order, each as its batch is ready; EndOfEpoch ends
                                       them early at the epoch's end
                       Release      (no reply: the job is done with those batches' slots)
                       Pause        (no reply: the job gave up the rest of its epoch, its
                                     iterator dropped; it holds and needs nothing until Begin)
                       Bye          (no reply: detach now)
    any -> daemon      Status       -> StatusReply
    daemon -> job      Detached, ShuttingDown   (unsolicited, then the daemon closes the socket)
    daemon -> worker   PrepTask     -> PrepDone | PrepFailed     (workers.py; PrepFailed: a `Failure`)

Any request may also be answered by Refused (the daemon refused it and closes
the connection: a message out of order, or one it failed on).
"""

import dataclasses
import functools
import socket
import struct
import traceback
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Generic, TypeGuard, TypeVar

import msgpack

from coordl.errors import ConfigError, CoordinatorError, SampleError, item_of

VERSION = 7  # 3: Resume/Resumed; 4: BatchFailed carries a Failure; 5: sample specs, kind "config"; 6: Pause;
# 7: Next(count), Release(count)
HEADER = struct.Struct(">I")
MAX_REQUEST = 64 * 1024      # bytes of one frame the daemon accepts from a client
MAX_REPLY = 4 * 1024 * 1024  # bytes of one frame a client accepts from the daemon
MAX_NEXT = 2**20             # batches one Next may ask for


class ProtocolError(CoordinatorError):
    """A frame that is too large, not msgpack, or not a message the receiver accepts."""


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""

    def encode(self) -> bytes:
        fields_ = {"type": self.TYPE, **self.__dict__}
        try:
            body = msgpack.packb(fields_, use_bin_type=True)
        except UnicodeEncodeError:  # a path that is not UTF-8 (os.fsdecode's surrogates)
            body = msgpack.packb(_printable(fields_), use_bin_type=True)
        return HEADER.pack(len(body)) + body


def printable(text: str) -> str:
    """`text` as valid UTF-8: the bytes of a non-UTF-8 path (``os.fsdecode``'s surrogate
    escapes) shown as ``\\xff``. Paths on the wire are for people to read (error messages,
    `coordl status`); the one path a receiver opens, Welcome.ring, is ASCII (segments.py)."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _is_map(value: object) -> TypeGuard[dict[Any, Any]]:
    """Whether `value` is a dict (a msgpack map: keys and values of any msgpack type)."""
    return isinstance(value, dict)


def _is_array(value: object) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    """Whether `value` is a list or tuple (a msgpack array: items of any msgpack type)."""
    return isinstance(value, (list, tuple))


def _printable(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if _is_map(value):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if _is_array(value):
        return [_printable(v) for v in value]
    return value


M = TypeVar("M", bound=Message)  # the messages one receiver accepts (a registry's union)


def _registry(*classes: type[M]) -> dict[str, type[M]]:
    return {c.TYPE: c for c in classes}


FAILURE_KINDS = ("sample", "config", "internal")
MAX_TRACEBACK = 16 * 1024  # characters of a worker's traceback that travel (its last ones)
MAX_ERROR = 4 * 1024       # ... of its one-line error (the first ones)


def _check_kind(kind: str) -> None:
    if kind not in FAILURE_KINDS:  # decode() builds messages through __init__: a bad kind is refused
        raise ProtocolError(f"failure kind {kind!r} is not one of {list(FAILURE_KINDS)}")


# What one row of the ring may hold (coordinator/spec.py): a tensor of a fixed shape of at most
# MAX_SAMPLE_DIMS dimensions, each 1..MAX_SAMPLE_DIM, of one of these numpy dtypes (by name).
SAMPLE_DTYPES = ("uint8", "int16", "int32", "int64", "float16", "float32", "float64")
MAX_SAMPLE_DIMS = 7
MAX_SAMPLE_DIM = 2**31 - 1


def check_sample(shape: list[int], dtype: str, hwc: bool = False) -> None:
    """Refuse a sample spec (Hello's, Welcome's) that no ring row can hold; decode() builds
    messages through __init__, so a bad one from the wire is a ProtocolError."""
    if dtype not in SAMPLE_DTYPES:
        raise ProtocolError(f"sample dtype {dtype!r} is not one of {list(SAMPLE_DTYPES)}")
    if len(shape) > MAX_SAMPLE_DIMS or not all(1 <= d <= MAX_SAMPLE_DIM for d in shape):
        raise ProtocolError(f"sample shape {shape!r:.80} is not at most {MAX_SAMPLE_DIMS} dimensions "
                            f"of 1 to {MAX_SAMPLE_DIM}")
    if hwc and not (len(shape) == 3 and shape[0] == shape[1] and shape[2] == 3 and dtype == "uint8"):
        raise ProtocolError(f"an image ring's rows are uint8 (N, N, 3), not {dtype} {shape!r:.80}")


@dataclass(frozen=True)
class Failure:
    """Why a chunk of a batch could not be prepared, as data (torch's ``ExceptionWrapper``, DALI's
    ``failed(..., traceback)``): made by a prep worker (`from_exception`, workers.py), carried by
    PrepFailed to the daemon, kept by the ring's FAILED slot, sent to each job in BatchFailed;
    client.py raises `SampleError` for a "sample" failure and `CoordinatorError` with the
    worker's traceback for an "internal" one."""
    kind: str               # "sample": a bad item (SampleError); "config": the dataset or the daemon's
                            # settings (ConfigError: e.g. a sample of another shape than the ring's);
                            # "internal": a bug, a crash, a death
    error: str              # one line: "SampleError: /data/cat/1.jpg: truncated: ..."
    item: int | None = None  # the dataset item the worker was at, when known
    file: str = ""          # its file, when known
    traceback: str = ""     # the worker's formatted traceback, at most MAX_TRACEBACK characters

    def __post_init__(self) -> None:
        _check_kind(self.kind)

    def __str__(self) -> str:
        return self.error

    @classmethod
    def from_exception(cls, exc: BaseException, file_of: Callable[[int], str]) -> "Failure":
        """What a prep worker sends for `exc`: a `SampleError` is the item's fault ("sample"), a
        `ConfigError` the dataset's or the settings' ("config"), anything else coordl's or the
        environment's ("internal"); the item is the one the
        dataset noted (`coordl.errors.at_item`), `file_of(item)` its file."""
        item = item_of(exc)
        file = ""
        if item is not None:
            try:
                file = printable(file_of(item))
            except Exception:  # noqa: BLE001 (the report must not fail: the item stays named)
                file = ""
        kind = "sample" if isinstance(exc, SampleError) else "config" if isinstance(exc, ConfigError) \
            else "internal"
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(kind, f"{type(exc).__name__}: {exc}"[:MAX_ERROR], item, file, text[-MAX_TRACEBACK:])


# -- job -> daemon ----------------------------------------------------------------
@dataclass(frozen=True)
class Hello(Message):
    """A job asks to attach; the daemon checks every field that changes a batch against its own."""
    TYPE: ClassVar[str] = "hello"
    version: int
    fingerprint: str   # the job's dataset fingerprint (coordl/manifest/build.py)
    root: str          # the job's dataset folder (for error messages; `printable`)
    items: int
    transform: str
    size: int
    seed: int          # the job's ImageFolder seed (order and augmentation)
    on_error: str      # the job's ImageFolder on_error
    batch_size: int
    shuffle: bool
    drop_last: bool
    pid: int
    sample_shape: list[int]  # the job's dataset's samples: (3, size, size) for an image dataset,
    sample_dtype: str        # else its sample_spec() (coordinator/spec.py); SAMPLE_DTYPES

    def __post_init__(self) -> None:
        check_sample(self.sample_shape, self.sample_dtype)


@dataclass(frozen=True)
class Resume(Message):
    """Continue from a checkpoint (client.py `load_state_dict`): the next Begin starts at batch
    `batches` of daemon epoch `epoch`; the job's first epoch was `start_epoch` (with --epochs
    it gets the epochs it had left). Only before the job's first Begin."""
    TYPE: ClassVar[str] = "resume"
    epoch: int
    batches: int       # batches of `epoch` the job had received
    start_epoch: int


@dataclass(frozen=True)
class Begin(Message):
    TYPE: ClassVar[str] = "begin"


@dataclass(frozen=True)
class Next(Message):
    """The job's next `count` batches (a job of its own batch size asks for every chunk of a
    batch at once: assemble.py); the daemon answers each in order as it is ready."""
    TYPE: ClassVar[str] = "next"
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_NEXT:
            raise ProtocolError(f"next count {self.count} is not 1 to {MAX_NEXT}")


@dataclass(frozen=True)
class Release(Message):
    TYPE: ClassVar[str] = "release"
    index: int         # global batch index (plan.py) the job is done with
    count: int = 1     # ... and the count - 1 batches after it

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_NEXT:
            raise ProtocolError(f"release count {self.count} is not 1 to {MAX_NEXT}")


@dataclass(frozen=True)
class Pause(Message):
    """The job's iterator was dropped mid-epoch (a `break`): it gives up the rest of the epoch and
    holds and needs no batch until its next Begin (scheduler.py `pause`)."""
    TYPE: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Bye(Message):
    TYPE: ClassVar[str] = "bye"


@dataclass(frozen=True)
class Status(Message):
    TYPE: ClassVar[str] = "status"


# -- daemon -> job ----------------------------------------------------------------
@dataclass(frozen=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    job: int                 # the job's id at this daemon
    pid: int                 # the daemon's pid
    ring: str                # path of the ring segment (ring.py)
    slots: int
    batch_size: int
    sample_shape: list[int]  # one row of the ring's samples (ring.py Layout; coordinator/spec.py)
    sample_dtype: str        # its numpy dtype name (SAMPLE_DTYPES)
    sample_hwc: bool         # rows are uint8 (N, N, 3) images the job gets as (3, N, N)
    batches_per_epoch: int
    epochs: int | None       # epochs each job gets (None: as many as it iterates)
    seed: int
    start_epoch: int         # the job's first epoch (late joiners: the next boundary)

    def __post_init__(self) -> None:
        check_sample(self.sample_shape, self.sample_dtype, self.sample_hwc)


@dataclass(frozen=True)
class Resumed(Message):
    """Where the job's next Begin starts (a whole epoch received: batch 0 of the next)."""
    TYPE: ClassVar[str] = "resumed"
    start_epoch: int
    epoch: int
    batches: int


@dataclass(frozen=True)
class Refused(Message):
    TYPE: ClassVar[str] = "refused"
    reason: str


@dataclass(frozen=True)
class EpochStart(Message):
    TYPE: ClassVar[str] = "epoch"
    epoch: int
    batches: int


@dataclass(frozen=True)
class Ready(Message):
    """Batch `index` lies in `slot`: its first `n` rows are valid; the job holds it until Release."""
    TYPE: ClassVar[str] = "ready"
    index: int
    epoch: int
    slot: int
    n: int


@dataclass(frozen=True)
class EndOfEpoch(Message):
    TYPE: ClassVar[str] = "end"
    epoch: int


@dataclass(frozen=True)
class BatchFailed(Message):
    """Batch `index` could not be prepared: the first `Failure` of its chunks, field by field."""
    TYPE: ClassVar[str] = "failed"
    index: int
    kind: str          # FAILURE_KINDS: "sample" (a bad item), "config" (the dataset's or the settings'
                       # fault, e.g. a sample of another shape than the ring's) or "internal" (the rest)
    error: str         # one line: the exception's type and message (a bad item's names its file)
    item: int | None   # the dataset item it happened at (None: not known, e.g. a worker died)
    file: str          # that item's file ("" when not known; `printable`)
    traceback: str     # the prep worker's formatted traceback ("" when it has none)

    def __post_init__(self) -> None:
        _check_kind(self.kind)

    @classmethod
    def of(cls, index: int, failure: Failure) -> "BatchFailed":
        return cls(index, failure.kind, failure.error, failure.item, failure.file, failure.traceback)

    @property
    def failure(self) -> Failure:
        return Failure(self.kind, self.error, self.item, self.file, self.traceback)


@dataclass(frozen=True)
class Detached(Message):
    TYPE: ClassVar[str] = "detached"
    reason: str


@dataclass(frozen=True)
class ShuttingDown(Message):
    TYPE: ClassVar[str] = "shutdown"
    reason: str


@dataclass(frozen=True)
class StatusReply(Message):
    TYPE: ClassVar[str] = "status_reply"
    status: dict[str, Any]   # see Daemon.status()


# -- daemon <-> prep worker ---------------------------------------------------------
@dataclass(frozen=True)
class PrepTask(Message):
    """Prepare rows lo..hi of batch `index` into `slot`."""
    TYPE: ClassVar[str] = "prep"
    slot: int
    index: int
    lo: int
    hi: int


@dataclass(frozen=True)
class PrepDone(Message):
    """Rows lo..lo+kept hold the samples kept (kept < hi - lo only with on_error='skip')."""
    TYPE: ClassVar[str] = "prep_done"
    slot: int
    index: int
    lo: int
    hi: int
    kept: int
    counters: dict[str, int]  # this task's counter increments (stats.KEYS)


@dataclass(frozen=True)
class PrepFailed(Message):
    """Rows lo..hi of batch `index` could not be prepared; the fields are a `Failure`'s."""
    TYPE: ClassVar[str] = "prep_failed"
    slot: int
    index: int
    lo: int
    hi: int
    kind: str
    error: str
    item: int | None
    file: str
    traceback: str

    def __post_init__(self) -> None:
        _check_kind(self.kind)

    @classmethod
    def of(cls, task: "PrepTask", failure: Failure) -> "PrepFailed":
        return cls(task.slot, task.index, task.lo, task.hi, failure.kind, failure.error,
                   failure.item, failure.file, failure.traceback)

    @property
    def failure(self) -> Failure:
        return Failure(self.kind, self.error, self.item, self.file, self.traceback)


TO_DAEMON = _registry(Hello, Resume, Begin, Next, Release, Pause, Bye, Status)
TO_JOB = _registry(Welcome, Resumed, Refused, EpochStart, Ready, EndOfEpoch, BatchFailed, Detached,
                   ShuttingDown, StatusReply)
TO_WORKER = _registry(PrepTask)
FROM_WORKER = _registry(PrepDone, PrepFailed)


def _fits(value: object, tp: Any) -> bool:
    """Whether `value` (decoded msgpack) is of the field type `tp`; a ``dict[...]`` field is checked
    as a map only (its keys and values are not looked at)."""
    if tp is int:  # most fields: checked first (a bool is not one)
        return type(value) is int and -2**63 <= value < 2**63
    if isinstance(tp, types.UnionType):
        return any(_fits(value, t) for t in typing.get_args(tp))
    if typing.get_origin(tp) is dict:
        return isinstance(value, dict)
    if tp is type(None):
        return value is None
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return _is_array(value) and all(_fits(v, item) for v in value)
    return isinstance(value, tp)


def decode(body: bytes, accepted: dict[str, type[M]]) -> M:
    """One frame's body -> the message, validated against `accepted`."""
    try:
        data = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ProtocolError(f"frame is not valid msgpack ({type(e).__name__})") from None
    if not _is_map(data):
        raise ProtocolError(f"frame is a msgpack {type(data).__name__}, not a map")
    kind = data.pop("type", None)
    cls = accepted.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"message type {kind!r} is not one of {sorted(accepted)}")
    schema = _schema(cls)
    if not _required(cls) <= data.keys() <= schema.keys():  # a field with a default may be left out
        raise ProtocolError(f"{kind!r} message has fields {sorted(map(str, data))}, "
                            f"expected {sorted(schema)}")
    for name, value in data.items():
        if not _fits(value, schema[name]):
            raise ProtocolError(f"{kind!r} message field {name!r} = {value!r:.40} is not "
                                f"{schema[name]}")
    return cls(**data)


@functools.cache
def _schema(cls: type[Message]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


@functools.cache
def _required(cls: type[Message]) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


class FrameReader(Generic[M]):
    """Splits a byte stream into messages; refuses frames longer than `limit` bytes."""

    def __init__(self, accepted: dict[str, type[M]], limit: int) -> None:
        self.accepted, self.limit = accepted, limit
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[M]:
        self._buf += data
        out: list[M] = []
        while len(self._buf) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > self.limit:
                raise ProtocolError(f"frame of {length} bytes is over the limit of {self.limit}")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            body = bytes(self._buf[HEADER.size:end])
            del self._buf[:end]
            out.append(decode(body, self.accepted))
        return out


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)
