"""The lock-free batch-buffer hand-over runs only where it is correct (issue 11, point 8)."""

from __future__ import annotations

import platform

import pytest

from coordl.buffers import WorkerBuffers, check_platform
from coordl.errors import ConfigError


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le", "riscv64"])
def test_weakly_ordered_cpus_are_refused_with_the_platform_and_the_fix(machine):
    with pytest.raises(ConfigError) as e:
        check_platform(machine)
    assert machine in str(e.value) and "x86-64" in str(e.value) and "reuse_buffers=False" in str(e.value)


def test_x86_64_runs_the_lock_free_path():
    check_platform("x86_64")
    if platform.machine() == "x86_64":
        assert WorkerBuffers(3).slots == 3   # this machine: a worker keeps its buffers
    else:
        with pytest.raises(ConfigError, match=platform.machine()):
            WorkerBuffers(3)


def test_the_loader_default_follows_the_platform(tiny_root):
    import coordl

    loader = coordl.DataLoader(coordl.ImageFolder(tiny_root, transform="val", size=16), num_workers=2)
    assert loader.reuse_buffers is (platform.machine().lower() in ("x86_64", "amd64"))
    assert coordl.DataLoader([1, 2], reuse_buffers=False).reuse_buffers is False
