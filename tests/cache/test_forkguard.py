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
    # one fork guard: no module of coordl/, cache/ or pipelines/ compares pids inline but ForkGuard's own
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    files = [p for folder in ("coordl", "cache", "pipelines") for p in sorted((root / folder).rglob("*.py"))
             if p != root / "cache" / "forkguard.py"]
    assert len(files) > 100
    inline = [str(p.relative_to(root)) for p in files if any(s in p.read_text()
                                                             for s in ("!= os.getpid()", "== os.getpid()",
                                                                       "os.getpid() !=", "os.getpid() =="))]
    assert inline == []
