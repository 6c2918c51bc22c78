"""A node shared by several users: `coordl cache ls|drop --all` and `coordl cleanup` run by one
user list another user's segments, leave them alone and finish (issue 10, point 4).

Two real uids, as the kernel sees them: the test runs as root, and each side is a forked
child that drops to its own uid (setgroups/setgid/setuid), so every open and unlink below
meets the kernel's own permission checks (mode 0600 files in a sticky folder, like /dev/shm).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import shutil
import traceback

import pytest
from click.testing import CliRunner

from coordl.cache import shm
from coordl.cache.minio.cache import MinIOCache
from coordl.cli.commands import main

FORK = mp.get_context("fork")
THEIRS, MINE = 64101, 64102  # two uids without passwd entries: nobody else's files

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two real users")


@pytest.fixture
def node_dir():
    """A sticky, world-writable folder on the tmpfs, as /dev/shm is (its name holds no 'coordl')."""
    d = os.path.join(shm.SHM_DIR, f"shared-node-test-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def _as_user(uid: int, fn, *args):
    """Run fn(*args) in a forked child whose real and effective uid and gid are `uid`; its result."""
    parent, child = FORK.Pipe()

    def body() -> None:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            child.send(("ok", fn(*args)))
        except Exception:  # noqa: BLE001 (the traceback travels to the test as data)
            child.send(("raised", traceback.format_exc()))

    p = FORK.Process(target=body)
    p.start()
    kind, value = parent.recv()
    p.join(30)
    assert kind == "ok", value
    return value


def _their_segments(directory: str) -> list[str]:
    """What a user whose processes died left: a cache, a ring and a half-built cache."""
    cache = MinIOCache(4096, directory=directory).open(secrets.token_hex(32), 4, "/data/theirs")
    cache.put(0, b"their bytes")
    ring = os.path.join(directory, "coordl-serve-1-1-abcdef012345-ring")  # a dead daemon's name
    tmp = os.path.join(directory, f"{shm.PREFIX}{'c' * 16}.tmp-1-1")      # a dead builder's
    for path in (ring, tmp):
        os.close(shm.create(path, 4096, "a test segment", "none"))
    return sorted([cache.name, os.path.basename(ring), os.path.basename(tmp)])


def _orphan(directory: str) -> str:
    """A cache whose creator (a child of the caller) is dead and nothing is attached: cleanup's."""
    p = FORK.Process(target=lambda: MinIOCache(4096, directory=directory).open(
        secrets.token_hex(32), 4, "/data/mine").put(1, b"x"))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    (name,) = [n for n in os.listdir(directory) if os.stat(os.path.join(directory, n)).st_uid == os.getuid()]
    return name


def _run(directory: str) -> dict:
    """As the other user: make an orphan, then ls, cleanup, another orphan, drop --all."""
    out = {}
    runner = CliRunner()
    out["orphan"] = _orphan(directory)
    for key, args in (("ls", ["cache", "ls"]), ("cleanup", ["cleanup", "--caches"])):
        r = runner.invoke(main, [*args, "--dir", directory])
        out[key] = (r.exit_code, r.output, repr(r.exception) if r.exit_code else None)
    out["kept"] = MinIOCache(4096, directory=directory).open(secrets.token_hex(32), 4).name
    r = runner.invoke(main, ["cache", "drop", "--all", "--dir", directory])
    out["drop"] = (r.exit_code, r.output, repr(r.exception) if r.exit_code else None)
    out["left"] = sorted(os.listdir(directory))
    return out


def test_other_users_segments_are_listed_skipped_and_left_alone(node_dir):
    theirs = _as_user(THEIRS, _their_segments, node_dir)
    assert all(os.stat(os.path.join(node_dir, n)).st_uid == THEIRS for n in theirs)
    got = _as_user(MINE, _run, node_dir)
    for key in ("ls", "cleanup", "drop"):
        code, output, exc = got[key]
        assert code == 0 and "Traceback" not in output, f"coordl {key} failed: {exc}\n{output}"
    their_cache = next(n for n in theirs if n.startswith(shm.PREFIX) and ".tmp-" not in n)
    ls = got["ls"][1]
    assert got["orphan"] in ls and f"{their_cache}  (another user's: uid {THEIRS}" in ls
    cleanup = got["cleanup"][1]
    assert f"removed {got['orphan']}" in cleanup
    for name in theirs:                   # the dead daemon's ring and dead builder's file too
        assert f"skipped {name}: another user's (uid {THEIRS}), left alone" in cleanup
    assert f"removed 1 cache segment from {node_dir}" in cleanup and "skipped 3 of other users" in cleanup
    drop = got["drop"][1]
    assert f"dropped {got['kept']}" in drop and f"skipped {their_cache}: another user's" in drop
    assert got["left"] == theirs == sorted(os.listdir(node_dir))   # theirs, untouched, and only theirs


def _drop_theirs(directory: str, name: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["cache", "drop", name, "--dir", directory])
    return r.exit_code, r.output


def test_dropping_another_users_cache_by_name_is_refused_with_the_owner(node_dir):
    theirs = _as_user(THEIRS, _their_segments, node_dir)
    their_cache = next(n for n in theirs if n.startswith(shm.PREFIX) and ".tmp-" not in n)
    code, output = _as_user(MINE, _drop_theirs, node_dir, their_cache)
    assert code == 2 and f"belongs to uid {THEIRS}: only they (or root) can drop it" in output
    assert sorted(os.listdir(node_dir)) == theirs
