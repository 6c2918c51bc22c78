"""cache/forkguard.py: the one fork guard, checked across a real fork."""

from __future__ import annotations

import os

from coordl.cache.forkguard import ForkGuard


def test_owner_in_the_process_that_made_it():
    guard = ForkGuard()
    assert guard.owner() and not guard.forked() and guard.pid == os.getpid()


def test_a_forked_child_sees_forked_until_it_resets(in_child):
    guard = ForkGuard()

    def child() -> bool:
        before = guard.forked() and not guard.owner()
        guard.reset()
        return before and guard.owner() and not guard.forked() and guard.pid == os.getpid()

    assert in_child(child) == 0
    assert guard.owner() and guard.pid == os.getpid()  # the child's reset is its own


def test_not_owned_until_the_first_reset():
    guard = ForkGuard(owned=False)
    assert guard.forked() and not guard.owner()
    guard.reset()
    assert guard.owner()


def test_no_copy_of_the_pid_check_left_inline():
    # the five places that compared pids inline now ask a ForkGuard
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    files = ["cache/minio/cache.py", "cache/partitioned/cache.py", "cache/storage/objstore.py", "coordl/buffers.py",
             "coordl/datasets/imagefolder.py", "coordl/coordinator/client.py"]
    inline = [f for f in files if any(s in (root / f).read_text()
                                      for s in ("!= os.getpid()", "== os.getpid()", "os.getpid() !="))]
    assert inline == []
