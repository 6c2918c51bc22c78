"""`coordl serve --cache` follows the MinIO cache's rule (issue 24, point 6): capped to the
dataset's bytes; another size than an existing cache's is honoured when nobody uses it, refused
with both sizes while somebody does; never silently the old one."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import coordl
from coordl.cache import shm
from coordl.cache.minio.layout import data_offset

from .conftest import COORDL


@pytest.fixture
def own_root(tiny_root, tmp_path):
    """A copy of tiny_root with fresh mtimes: a dataset (and a cache segment) of this test alone;
    the segment is unlinked after the test, whatever happens."""
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    ds = coordl.ImageFolder(root, transform="val", size=32)
    yield root
    shm.unlink(os.path.join(shm.SHM_DIR, shm.segment_name(ds.fingerprint)))


def _segment(root: str) -> str:
    return os.path.join(shm.SHM_DIR, shm.segment_name(coordl.ImageFolder(root).fingerprint))


def _serve_refused(root: str, sockdir: str, cache: str) -> str:
    done = subprocess.run([COORDL, "serve", "--data", root, "--batch-size", "4", "--size", "32",
                           "--workers", "1", "--socket", os.path.join(sockdir, "refused.sock"),
                           "--cache", cache], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stderr


def test_serve_cache_larger_than_the_folder_is_capped_to_the_dataset(own_root, serve):
    total = coordl.ImageFolder(own_root).manifest.total_bytes
    served = serve(own_root, cache="64GiB", workers=1)     # was refused: 64 GiB does not fit /dev/shm
    assert served.status()["cache"]["cache_capacity"] == total
    path = _segment(own_root)
    n = len(coordl.ImageFolder(own_root))
    assert os.stat(path).st_size == data_offset(n) + total
    assert os.stat(path).st_blocks * 512 <= data_offset(n)          # nothing cached, nothing taken
    assert served.stop() == 0


def test_serve_another_size_refused_while_in_use_honoured_once_unused(own_root, serve, sockdir):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    total = ds.manifest.total_bytes
    holder = coordl.DataLoader(ds, batch_size=8, cache=total // 2)
    try:
        err = _serve_refused(own_root, sockdir, str(total // 4))   # was silently total // 2
        assert shm.fmt_bytes(total // 2) in err and shm.fmt_bytes(total // 4) in err
        assert f"--cache {total // 2}" in err and str(os.getpid()) in err
        err = _serve_refused(own_root, sockdir, "64GiB")           # capped to total: still differs
        assert "capped to the dataset" in err and shm.fmt_bytes(total) in err
        shared = serve(own_root, cache=str(total // 2), workers=1, name="shared.sock")
        assert shared.status()["cache"]["cache_capacity"] == total // 2
        assert shared.stop() == 0
    finally:
        holder.dataset.cache.close()
    served = serve(own_root, cache=str(total // 4), workers=1, name="new.sock")   # nobody uses it
    assert served.status()["cache"]["cache_capacity"] == total // 4
    assert served.status()["cache"]["cache_items"] == 0
    assert served.stop() == 0
