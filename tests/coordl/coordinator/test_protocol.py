"""protocol.py: frames round-trip; anything else is a ProtocolError, never a crash or an unpickle."""

import os
import pickle
import random
import struct

import msgpack
import pytest

from coordl.coordinator import protocol as p
from coordl.errors import SampleError, at_item


def test_every_message_round_trips():
    msgs = [p.Hello(2, "ab" * 32, "/data", 10, "train", 224, 5, "skip", 64, True, False, 42, [3, 224, 224], "uint8"),
            p.Begin(), p.Next(),
            p.Release(7), p.Release(3, 4), p.Next(5), p.Bye(), p.Status(), p.Resume(3, 4, 1)]
    reader = p.FrameReader(p.TO_DAEMON, p.MAX_REQUEST)
    wire = b"".join(m.encode() for m in msgs)
    out = []
    for i in range(0, len(wire), 3):  # frames split anywhere
        out += reader.feed(wire[i:i + 3])
    assert out == msgs
    replies = [p.Welcome(1, 2, "/dev/shm/x", 8, 64, [224, 224, 3], "uint8", True, 10, None, 0, 0), p.Ready(3, 0, 1, 64),
               p.EndOfEpoch(0), p.BatchFailed(3, "sample", "SampleError: bad.jpg", 7, "/d/bad.jpg", ""),
               p.BatchFailed(4, "internal", "RuntimeError: x", None, "", "Traceback ..."),
               p.Detached("x"), p.ShuttingDown("y"),
               p.StatusReply({"jobs": [{"job": 1}]}), p.Refused("no"), p.EpochStart(1, 10),
               p.Resumed(1, 3, 4)]
    assert p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(b"".join(m.encode() for m in replies)) == replies


def test_failures_round_trip_from_worker_to_daemon_to_job():
    # a worker's exception, as data: its kind, the item and file the dataset noted, the traceback
    def prep(i):
        raise at_item(SampleError(f"/d/cat/{i}.jpg: truncated"), i)

    try:
        prep(7)
    except SampleError as e:
        failure = p.Failure.from_exception(e, lambda i: f"/d/cat/{i}.jpg")
    assert (failure.kind, failure.item, failure.file) == ("sample", 7, "/d/cat/7.jpg")
    assert failure.error == "SampleError: /d/cat/7.jpg: truncated"
    assert "Traceback (most recent call last)" in failure.traceback and "in prep" in failure.traceback
    try:
        {}["missing"]
    except KeyError as e:
        bug = p.Failure.from_exception(e, lambda i: "never asked")  # no item noted: none sent
    assert (bug.kind, bug.item, bug.file, bug.error) == ("internal", None, "", "KeyError: 'missing'")
    task = p.PrepTask(2, 9, 4, 8)
    sent = [p.PrepFailed.of(task, failure), p.PrepFailed.of(task, bug)]
    got = p.FrameReader(p.FROM_WORKER, p.MAX_REPLY).feed(b"".join(m.encode() for m in sent))
    assert got == sent and [m.failure for m in got] == [failure, bug]
    assert (got[0].slot, got[0].index, got[0].lo, got[0].hi) == (2, 9, 4, 8)
    replies = [p.BatchFailed.of(9, f) for f in (failure, bug)]
    got = p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(b"".join(m.encode() for m in replies))
    assert got == replies and [m.failure for m in got] == [failure, bug]


def test_a_long_traceback_keeps_its_end_and_a_bad_kind_is_refused():
    try:
        raise RuntimeError("the end of a long message " + "x" * 40000)
    except RuntimeError as e:
        failure = p.Failure.from_exception(e, str)
    assert len(failure.traceback) == p.MAX_TRACEBACK and failure.traceback.endswith("xxx\n")
    assert len(failure.error) == p.MAX_ERROR and failure.error.startswith("RuntimeError: the end of")
    assert len(p.BatchFailed.of(0, failure).encode()) < p.MAX_REPLY
    body = msgpack.packb({"type": "failed", "index": 1, "kind": "oops", "error": "x", "item": None,
                          "file": "", "traceback": ""})
    with pytest.raises(p.ProtocolError, match="failure kind 'oops' is not one of"):
        p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(struct.pack(">I", len(body)) + body)
    body = msgpack.packb({"type": "failed", "index": 1, "kind": "sample", "error": "x", "item": "7",
                          "file": "", "traceback": ""})
    with pytest.raises(p.ProtocolError, match="field 'item'"):
        p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(struct.pack(">I", len(body)) + body)


def test_strings_that_are_not_utf8_are_sent_printable():
    # os.fsdecode of a path with bytes that are not UTF-8: surrogate escapes
    msg = p.StatusReply({"data": os.fsdecode(b"/data-\xff"), "jobs": [{"error": "\ud800 x"}]})
    (out,) = p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(msg.encode())
    assert out.status == {"data": "/data-\\xff", "jobs": [{"error": "\\ud800 x"}]}
    assert p.printable("plain ascii and ünïcode") == "plain ascii and ünïcode"


def test_direction_is_enforced():
    with pytest.raises(p.ProtocolError, match="not one of"):
        p.FrameReader(p.TO_DAEMON, p.MAX_REQUEST).feed(p.Ready(1, 0, 0, 1).encode())


@pytest.mark.parametrize("obj, match", [
    ({"type": "release"}, "has fields"),
    ({"type": "release", "index": 1, "x": 2}, "has fields"),
    ({"type": "release", "index": "1"}, "is not"),
    ({"type": "release", "index": True}, "is not"),
    ({"type": "release", "index": 1.5}, "is not"),
    ({"type": "release", "index": 2**64 - 1}, "is not"),
    ({"type": "release", "index": 1, "count": 0}, "release count 0 is not 1 to"),
    ({"type": "next", "count": -1}, "next count -1 is not 1 to"),
    ({"type": "next", "count": "2"}, "is not"),
    ({"type": 5}, "not one of"),
    ([1, 2], "not a map"),
    ("hello", "not a map"),
])
def test_invalid_messages(obj, match):
    body = msgpack.packb(obj)
    with pytest.raises(p.ProtocolError, match=match):
        p.FrameReader(p.TO_DAEMON, p.MAX_REQUEST).feed(struct.pack(">I", len(body)) + body)


def test_oversized_frame_is_refused_before_it_is_read():
    with pytest.raises(p.ProtocolError, match="over the limit"):
        p.FrameReader(p.TO_DAEMON, p.MAX_REQUEST).feed(struct.pack(">I", p.MAX_REQUEST + 1))


def test_random_bytes_and_pickles_only_raise_protocol_errors():
    rng = random.Random(0)
    for _ in range(3000):
        body = os.urandom(rng.randint(0, 64))
        try:
            p.decode(body, p.TO_DAEMON)
        except p.ProtocolError:
            pass
    evil = pickle.dumps(p.Bye())
    with pytest.raises(p.ProtocolError):
        p.decode(evil, p.TO_DAEMON)


def test_resume_fields_are_validated():
    body = msgpack.packb({"type": "resume", "epoch": 1, "batches": "3", "start_epoch": 0})
    with pytest.raises(p.ProtocolError, match="'batches'"):
        p.decode(body, p.TO_DAEMON)
    body = msgpack.packb({"type": "resume", "epoch": 1, "batches": 3})
    with pytest.raises(p.ProtocolError, match="has fields"):
        p.decode(body, p.TO_DAEMON)
    with pytest.raises(p.ProtocolError, match="not one of"):  # a reply is not a request
        p.decode(msgpack.packb({"type": "resumed", "start_epoch": 0, "epoch": 1, "batches": 3}),
                 p.TO_DAEMON)
