"""The one stale-socket probe (coordl.cache.shm.socket_state) as the daemon and cleanup use it."""

from __future__ import annotations

import os
import shutil
import socket

import pytest

from coordl.coordinator import cleanup
from coordl.coordinator.daemon import _refuse_live_socket
from coordl.errors import CoordinatorError


def test_a_new_daemon_removes_a_stale_socket_and_refuses_a_live_one(tmp_path):
    path = str(tmp_path / "serve.sock")
    _refuse_live_socket(path)                              # nothing there: fine
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        assert not cleanup._stale_socket(path)
        with pytest.raises(CoordinatorError, match="already listens on"):
            _refuse_live_socket(path)
    finally:
        listener.close()
    assert cleanup._stale_socket(path)                     # its owner is gone, the file stays
    _refuse_live_socket(path)
    assert not (tmp_path / "serve.sock").exists()          # removed by the next daemon
    (tmp_path / "serve.sock").write_text("not a socket")
    with pytest.raises(CoordinatorError, match="is not a socket"):
        _refuse_live_socket(path)
    assert not cleanup._stale_socket(path)


def test_a_socket_folder_is_private_and_short_enough_for_a_socket(tmp_path, monkeypatch):
    """config.socket_folder: in $TMPDIR, or in /tmp where $TMPDIR is too long for a socket path
    (xdist's tmp_path under pytest-1NN did that to the Ray integration's daemons)."""
    import stat

    from coordl.coordinator.config import check_socket_path, socket_folder

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    short = socket_folder("t-")
    assert os.path.dirname(short) == str(tmp_path)
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr("tempfile.tempdir", None)
    moved = socket_folder("t-")
    try:
        assert os.path.dirname(moved) == "/tmp"
        assert stat.S_IMODE(os.stat(moved).st_mode) == 0o700
        path = os.path.join(moved, "serve.sock")
        check_socket_path(path)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)  # it fits
        assert os.listdir(deep) == []  # nothing left behind in the long one
    finally:
        shutil.rmtree(moved, ignore_errors=True)
