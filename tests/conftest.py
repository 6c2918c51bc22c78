"""Shared fixtures: small real JPEG datasets and leak checks.

`no_leaks` (autouse) fails a test that leaves a new coordl segment in
/dev/shm or a child process running. Datasets are real JPEG folders made by
coordl.synthetic, small enough to decode quickly.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from coordl.synthetic import make_dataset


def _coordl_shm() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if "coordl" in n}
    except FileNotFoundError:
        return set()


# Python's own per-interpreter helpers (started once by spawn/forkserver, live until exit)
_STDLIB_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _children() -> list[psutil.Process]:
    kids = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE or any(h in " ".join(p.cmdline()) for h in _STDLIB_HELPERS):
                continue
        except psutil.NoSuchProcess:
            continue
        kids.append(p)
    return kids


@pytest.fixture(autouse=True)
def no_leaks():
    """Every test leaves /dev/shm and the process tree as it found them."""
    shm_before = _coordl_shm()
    kids_before = {p.pid for p in _children()}
    yield
    deadline = time.monotonic() + 10.0
    while True:
        new_shm = _coordl_shm() - shm_before
        new_kids = [p for p in _children() if p.pid not in kids_before]
        if not new_shm and not new_kids:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    msg = []
    if new_shm:
        msg.append(f"left in /dev/shm: {sorted(new_shm)}")
    if new_kids:
        msg.append("child processes still running: " + ", ".join(
            f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in new_kids))
    pytest.fail("; ".join(msg))


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> str:
    """40 JPEGs, 4 classes, 160x120: fast to decode."""
    root = str(tmp_path_factory.mktemp("tiny"))
    make_dataset(root, images=40, classes=4, size=(160, 120), quality=85, seed=1, workers=1, progress=False)
    return root


@pytest.fixture(scope="session")
def photo_root(tmp_path_factory) -> str:
    """24 JPEGs at 500x375, quality 90 (photo-like sizes), some 1500x1125."""
    root = str(tmp_path_factory.mktemp("photo"))
    make_dataset(root, images=24, classes=3, seed=2, large_fraction=0.25, workers=1, progress=False)
    return root
