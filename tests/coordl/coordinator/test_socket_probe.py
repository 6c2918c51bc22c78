"""The one stale-socket probe (coordl.cache.shm.socket_state) as the daemon and cleanup use it."""

from __future__ import annotations

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
