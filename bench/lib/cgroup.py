"""cgroup v1 helpers for benchmarks: a memory-limited, storage-throttled child cgroup.

    with Cgroup("coordl-bench-1", memory_limit=..., read_bps=(dev, bps)) as cg:
        subprocess.run([..., "--join", ",".join(cg.procs_files)])   # the child writes its pid there

The memory cgroup is created as a child of this process's own memory cgroup
(so a limit set by the machine still applies above it); the blkio one as a
child of this process's blkio cgroup. Page cache pages are charged to the
cgroup of the process that first reads them, and reclaimed inside it when the
cgroup reaches `memory.limit_in_bytes`: that is how the page cache gets a
budget. `blkio.throttle.read_bps_device` ("MAJ:MIN BYTES") caps reads from
the disk. Both directories are removed on exit (their processes must be gone).
`why_not()` says in one line what is missing on this machine.
"""

from __future__ import annotations

import os
import time


def _mounts() -> dict[str, str]:
    """controller -> mount point of each cgroup v1 hierarchy."""
    out = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            _dev, mnt, fstype, opts = line.split()[:4]
            if fstype == "cgroup":
                for opt in opts.split(","):
                    out[opt] = mnt
    return out


def _own(controller: str) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, ctrls, path = line.rstrip("\n").split(":", 2)
            if controller in ctrls.split(","):
                return path
    return "/"


def base_dir(controller: str) -> str | None:
    mnt = _mounts().get(controller)
    return None if mnt is None else os.path.join(mnt, _own(controller).lstrip("/"))


def why_not(controller: str, knob: str) -> str | None:
    """None when a child cgroup of `controller` with `knob` can be made here; else the reason."""
    base = base_dir(controller)
    if base is None:
        v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        return (f"no cgroup v1 '{controller}' hierarchy is mounted"
                f"{' (this machine has cgroup v2 only)' if v2 else ''}")
    if not os.path.exists(os.path.join(base, knob)):
        return f"{base} has no {knob}"
    if not os.access(base, os.W_OK):
        return f"cannot create a child cgroup in {base} (not writable: run as root)"
    return None


def disk_of(path: str) -> str:
    """'MAJ:MIN' of the whole disk that holds `path` (blkio throttles disks, not partitions)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sys_dev = f"/sys/dev/block/{dev}"
    if os.path.exists(os.path.join(sys_dev, "partition")):
        with open(os.path.join(os.path.realpath(sys_dev), "..", "dev")) as f:
            dev = f.read().strip()
    return dev


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def read_stat(path: str) -> dict[str, int]:
    with open(path) as f:
        return {k: int(v) for k, v in (line.split() for line in f if len(line.split()) == 2)}


class Cgroup:
    """A memory cgroup (optional limit) plus a blkio cgroup (optional read throttle)."""

    def __init__(self, name: str, memory_limit: int | None = None,
                 read_bps: tuple[str, int] | None = None, blkio: bool = True) -> None:
        self.memory = os.path.join(base_dir("memory"), name)
        self.blkio = os.path.join(base_dir("blkio"), name) if blkio else None
        self.memory_limit, self.read_bps = memory_limit, read_bps

    def __enter__(self) -> Cgroup:
        os.mkdir(self.memory)
        try:
            if self.memory_limit is not None:
                _write(os.path.join(self.memory, "memory.limit_in_bytes"), str(self.memory_limit))
            if self.blkio is not None:
                os.mkdir(self.blkio)
                if self.read_bps is not None:
                    dev, bps = self.read_bps
                    _write(os.path.join(self.blkio, "blkio.throttle.read_bps_device"), f"{dev} {bps}")
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in (self.memory, self.blkio) if d]

    def memory_stat(self) -> dict[str, int]:
        return read_stat(os.path.join(self.memory, "memory.stat"))

    def max_usage(self) -> int:
        with open(os.path.join(self.memory, "memory.max_usage_in_bytes")) as f:
            return int(f.read())

    def __exit__(self, *exc) -> None:
        for d in (self.blkio, self.memory):
            for _ in range(50):
                try:
                    if d is not None and os.path.isdir(d):
                        os.rmdir(d)
                    break
                except OSError:  # EBUSY while the last task is exiting
                    time.sleep(0.1)
            else:
                print(f"bench: could not remove cgroup {d}: remove it with rmdir", flush=True)


def join(procs_files: list[str]) -> None:
    """Move the calling process into the cgroups (children it starts later inherit them)."""
    for f in procs_files:
        _write(f, str(os.getpid()))
