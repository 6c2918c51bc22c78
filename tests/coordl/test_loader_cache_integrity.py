"""coordl.DataLoader(cache=...) never serves bytes that do not match their checksum (issue 10, point 1)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import torch
from coordl_tests_loaderhelp import batches_of, epoch_batches_counts

import coordl
from coordl.cache import shm
from coordl.cache.minio.layout import Segment


def _scribble(path: str, items: list[int]) -> None:
    """Overwrite the first 64 bytes of each item's entry in the segment file (a stray write)."""
    fd = os.open(path, os.O_RDWR)
    seg = Segment(fd, path)
    try:
        for i in items:
            assert seg.lengths[i] > 64
            off = seg.data_offset + int(seg.offsets[i])
            os.pwrite(fd, np.random.default_rng(i).integers(0, 256, 64, dtype=np.uint8).tobytes(), off)
    finally:
        seg.close()


def test_a_corrupted_cache_entry_is_counted_and_the_loader_yields_the_files_true_pixels(tiny_root, tmp_path):
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)   # a dataset (and cache) of its own
    ds = coordl.ImageFolder(root, transform="val", size=32)
    n = len(ds)
    truth = batches_of(coordl.DataLoader(ds, batch_size=8))           # no cache: the files' pixels
    path = os.path.join(shm.SHM_DIR, shm.segment_name(ds.fingerprint))
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True,
                               cache=2 * ds.manifest.total_bytes)
    try:
        first, counts = epoch_batches_counts(loader)
        assert counts["cache_inserts"] == n and counts["cache_corrupt"] == 0
        bad = [3, 17, n - 1]
        _scribble(path, bad)
        for _ in range(2):  # the second epoch: counted once, still never served
            got, counts = epoch_batches_counts(loader)
            for (a, la), (b, lb) in zip(got, truth):
                assert torch.equal(la, lb) and torch.equal(a, b), "the loader served corrupt bytes"
            assert len(got) == len(truth)
            # detected once, node-wide; every epoch reads the bad items from storage, never re-admits
            assert loader.stats()["cache_corrupt"] == len(bad)
            assert counts["cache_hits"] == n - len(bad) and counts["cache_misses"] == len(bad)
            assert counts["storage_reads"] == len(bad) and counts["cache_inserts"] == 0
    finally:
        del loader
        shm.unlink(path)
