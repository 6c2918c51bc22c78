"""`ForkGuard`: has this object been copied into a forked child since it was made?

Clients, thread pools, locks and open files are copied into worker processes by fork
and must not be used there as they are (redis-py's ``_checkpid`` for the same reason).
An object keeps a guard beside such state and asks it before use:

    self._fork = ForkGuard()
    ...
    if self._fork.forked():      # a child: the parent's connections are not ours
        self._reconnect()
        self._fork.reset()       # ... and now this process owns them

`owner()` answers the other way round (close only what this process made).
`ForkGuard(owned=False)` starts as not owned by anyone, so the first use builds.
"""

from __future__ import annotations

import os


class ForkGuard:
    """The pid of the process that owns the state beside it (see the module docstring)."""

    __slots__ = ("pid",)

    def __init__(self, owned: bool = True) -> None:
        self.pid = os.getpid() if owned else -1

    def forked(self) -> bool:
        """True in any process but the owner (in a forked child, or before the first `reset`)."""
        return self.pid != os.getpid()

    def owner(self) -> bool:
        """True in the process that owns the state."""
        return self.pid == os.getpid()

    def reset(self) -> None:
        """Make this process the owner (after rebuilding the state in it)."""
        self.pid = os.getpid()

    def __repr__(self) -> str:
        return f"ForkGuard(pid={self.pid})"
