"""coordl.cache.shm, the one shared-memory toolbox: creation, listing, sockets, liveness."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest

from coordl.cache import shm
from coordl.errors import CacheError, CoordinatorError

FORK = mp.get_context("fork")


def test_create_is_exclusive_private_and_fully_allocated(tmp_path):
    path = str(tmp_path / "coordl-x")
    fd = shm.create(path, 3 * 4096 + 1, "a test segment", "pass less")
    try:
        st = os.fstat(fd)
        assert st.st_size == 3 * 4096 + 1 and st.st_mode & 0o777 == 0o600
        assert st.st_blocks * 512 >= 3 * 4096 + 1        # allocated now, no SIGBUS later
    finally:
        os.close(fd)
    with pytest.raises(FileExistsError):
        shm.create(path, 4096, "a test segment", "pass less")


def test_out_of_space_names_what_the_free_space_and_the_fix_in_the_callers_error(tmp_path):
    free = shm.free_bytes(shm.SHM_DIR)
    path = os.path.join(shm.SHM_DIR, f"coordl-test-{os.getpid()}")
    with pytest.raises(CoordinatorError) as e:
        shm.create(path, free + 2**30, "the ring (huge)", "pass fewer --slots", CoordinatorError)
    msg = str(e.value)
    assert msg.startswith(f"the ring (huge) does not fit {shm.SHM_DIR} (") and "free): pass fewer --slots" in msg
    assert "--shm-size" in msg and not os.path.exists(path)
    with pytest.raises(CacheError, match="is not usable"):
        shm.create(str(tmp_path / "missing" / "x"), 10, "a segment", "fix")


def test_list_names_by_prefix_and_building(tmp_path):
    for name in ("coordl-cache-a", "coordl-cache-b.tmp-1-2", "coordl-serve-1-2-ring", "other"):
        (tmp_path / name).touch()
    assert shm.list_names(str(tmp_path)) == ["coordl-cache-a"]
    assert shm.list_names(str(tmp_path), building=True) == ["coordl-cache-b.tmp-1-2"]
    assert shm.list_names(str(tmp_path), "coordl-serve-") == ["coordl-serve-1-2-ring"]
    assert shm.list_names(str(tmp_path / "none")) == []
    assert shm.others(str(tmp_path)) == []               # all ours


def test_alive_needs_pid_and_start_time():
    me = os.getpid()
    assert shm.alive(me, shm.proc_start(me)) and not shm.alive(me, shm.proc_start(me) + 1)
    p = FORK.Process(target=os.getpid)
    p.start()
    p.join()
    assert shm.proc_start(p.pid) is None


def test_socket_state_tells_live_from_stale_from_absent(tmp_path):
    path = str(tmp_path / "s")
    assert shm.socket_state(path) == shm.ABSENT
    (tmp_path / "f").touch()
    assert shm.socket_state(str(tmp_path / "f")) == shm.NOT_SOCKET
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        assert shm.socket_state(path) == shm.LIVE
    finally:
        listener.close()
    assert os.path.exists(path) and shm.socket_state(path) == shm.STALE   # the file outlived its owner
