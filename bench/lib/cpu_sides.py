"""CPU seconds on each side of an object-store bench: the emulated store's server and proxy, and the loader.

    sides = Sides(server=server.proc.pid, proxy=proxy.pid)
    before = sides.snapshot()        # {"server": s, "proxy": s, "loader": s}, cumulative
    ...one epoch...
    used = sides.since(before)       # the seconds each side used in between

A side's seconds are user + system (/proc/<pid>/stat, via psutil) of its process, of every live
descendant, and of the children each of them has already reaped (cutime/cstime), so a worker that
ends between two snapshots still counts. `loader` is this process and all its other descendants:
the client, the DataLoader's workers and what they start. `server` and `proxy` are the emulated
remote store: on a real store that CPU is on other machines, so it is the bench's own overhead.
"""

from __future__ import annotations

import psutil

SIDES = ("server", "proxy", "loader")


def _own(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _tree(p: psutil.Process, skip: set[int]) -> float:
    """p's seconds plus its live descendants' (those under a pid in `skip` left out)."""
    total, stack = 0.0, [p]
    while stack:
        q = stack.pop()
        try:
            total += _own(q)
            stack.extend(c for c in q.children() if c.pid not in skip)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass  # ended meanwhile: its time reaches its parent's cutime once reaped
    return total


class Sides:
    """See the module docstring."""

    def __init__(self, server: int | None, proxy: int | None) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in (("server", server), ("proxy", proxy)) if pid}
        self._me = psutil.Process()
        self._skip = {p.pid for p in self._procs.values()}

    def snapshot(self) -> dict[str, float]:
        out = {name: _tree(p, set()) for name, p in self._procs.items()}
        out["loader"] = _tree(self._me, self._skip)
        return {side: out.get(side, 0.0) for side in SIDES}

    def since(self, before: dict[str, float]) -> dict[str, float]:
        now = self.snapshot()
        return {side: now[side] - before[side] for side in SIDES}
