"""The daemon survives every client: odd paths, idle floods, silent and failing connections."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

import coordl
from coordl.coordinator import protocol as p
from coordl.coordinator.client import _Channel, status

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")
FAILING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "failing_serve.py")
LIMIT = 512  # daemon._MAX_CONNECTIONS


def _loader(root, served, **kw):
    ds = coordl.ImageFolder(root, transform="train", size=32)
    return coordl.DataLoader(ds, batch_size=4, shuffle=True, coordinator=served.address, timeout=60, **kw)


def _replies(sock: socket.socket, timeout: float = 30.0) -> list[p.Message]:
    """Everything the daemon sent on `sock` until it closed it."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(data)


def test_a_data_path_that_is_not_utf8_works_end_to_end(tiny_root, serve, tmp_path):
    root = os.path.join(os.fsencode(str(tmp_path)), b"data-\xff\xfe")
    shutil.copytree(tiny_root, os.fsdecode(root))
    served = serve(os.fsdecode(root))
    out = subprocess.run([COORDL, "status", "--socket", served.socket], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "data-\\xff\\xfe (40 items" in out.stdout
    js = subprocess.run([COORDL, "status", "--socket", served.socket, "--json"], capture_output=True,
                        text=True, timeout=60)
    assert js.returncode == 0 and json.loads(js.stdout)["data"].endswith("data-\\xff\\xfe")
    assert status(served.socket)["pid"] == served.pid  # it survived both
    loader = _loader(os.fsdecode(root), served)
    assert sum(images.shape[0] for images, _ in loader) == 40  # a job on that path is served
    loader.coordinator.close()
    assert served.stop() == 0


def test_idle_connections_never_lock_a_job_out_and_the_refused_are_told_the_limit(tiny_root, serve):
    served = serve(tiny_root, hello_timeout=600)  # nothing is closed for silence in this test
    first = _Channel(served.socket)  # the client's own connection object, oldest of all
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(599)]
    for s in idle:
        s.connect(served.socket)
    loader = _loader(tiny_root, served)  # the 601st connection: it still attaches ...
    assert len([x for x, _ in loader]) == 10  # ... and is served
    # 600 idle + the job against a limit of 512: the 89 oldest idle ones were told and closed
    with pytest.raises(coordl.CoordinatorError, match=f"refused this connection: the coordinator "
                       rf"\(pid {served.pid}\) keeps at most {LIMIT} connections open and had {LIMIT}: "
                       "this connection, the oldest that had not attached as a job, was closed"):
        first.send(p.Status())
    for s in idle[:88]:
        (msg,) = _replies(s)
        assert isinstance(msg, p.Refused) and f"keeps at most {LIMIT} connections" in msg.reason
    for s in idle[88:]:
        s.setblocking(False)
        with pytest.raises(BlockingIOError):  # still open, nothing sent
            s.recv(1)
    for s in idle:
        s.close()
    loader.coordinator.close()
    assert served.stop() == 0


def test_a_connection_that_never_says_hello_is_closed_after_the_hello_timeout(tiny_root, serve):
    served = serve(tiny_root, hello_timeout=1)
    loader = _loader(tiny_root, served)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(served.socket)
        (msg,) = _replies(silent)
    assert isinstance(msg, p.Refused)
    assert "did not attach as a job (hello) within --hello-timeout 1 s" in msg.reason
    assert len([x for x, _ in loader]) == 10  # an attached job is no silent connection
    loader.coordinator.close()
    assert served.stop() == 0


def test_an_error_in_one_connection_closes_that_connection_only(tiny_root, serve):
    served = serve(tiny_root, program=[sys.executable, FAILING], slots=3)
    broken, other = _loader(tiny_root, served), _loader(tiny_root, served)
    it = iter(broken)
    next(it)
    broken.coordinator.channel.send(p.Release(-1))  # the handler raises on this one
    with pytest.raises(coordl.CoordinatorError, match="failed on this connection's message "
                       r"\(RuntimeError: a bug in the handler of 'release', forced by the test; "
                       "see its log\\) and closed it"):
        for _ in it:
            pass
    assert len([x for x, _ in other]) == 10  # the other job goes on
    st = status(served.socket)
    assert st["pid"] == served.pid and [j["job"] for j in st["jobs"]] == [other.coordinator.job]
    other.coordinator.close()
    assert served.stop() == 0
    assert "RuntimeError: a bug in the handler" in served.log_text()


def test_when_every_connection_is_a_job_a_new_job_is_refused_in_words(tiny_root, serve):
    served = serve(tiny_root)
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
    hello = p.Hello(p.VERSION, ds.fingerprint, ds.root, len(ds), "train", 32, 0, "raise", 4, True,
                    False, os.getpid(), [3, 32, 32], "uint8").encode()
    attached = []
    for _ in range(LIMIT):  # real attaches over raw sockets: 512 jobs that never iterate
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(served.socket)
        s.sendall(hello)
        s.settimeout(30)
        reader, got = p.FrameReader(p.TO_JOB, p.MAX_REPLY), []
        while not got:
            got = reader.feed(s.recv(65536))
        assert isinstance(got[0], p.Welcome)
        attached.append(s)
    with pytest.raises(coordl.CoordinatorError, match=rf"keeps at most {LIMIT} connections open and "
                       rf"had {LIMIT}: every one of them is an attached job, so this one is refused"):
        _loader(tiny_root, served)
    attached.pop().close()  # one job leaves: the next one is served
    loader = None
    for _ in range(100):  # the daemon sees the close in its loop; the refusal names the limit
        try:
            loader = _loader(tiny_root, served)
            break
        except coordl.CoordinatorError as e:
            assert "every one of them is an attached job" in str(e)
    assert loader is not None and loader.coordinator.job == LIMIT + 1
    for s in attached:
        s.close()
    loader.coordinator.close()
    assert served.stop() == 0
