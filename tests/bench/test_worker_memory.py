"""Worker memory stays flat over epochs (issue 3: "RSS per worker flat over 5 epochs").

torch's DataLoader workers grow when a dataset keeps Python objects per item
(copy-on-access of refcounts); coordl keeps its manifest in numpy arrays.
Each worker writes batches into a few shared-memory buffers it reuses
(coordl/buffers.py): they are shared pages, counted apart from the
worker's private memory and bounded by the pool's size (`batch_buffers`).
The private (anonymous) memory must stay flat; a leaked per-batch object
of B x 224 x 224 x 3 bytes would add 4.8 MiB per batch at B=32.
bench/loaders.py reports whole RSS on the 3,000-image bench dataset.
"""

from __future__ import annotations

import psutil
import pytest

import coordl
from coordl.buffers import EXTRA_SLOTS
from coordl.cli.make_dataset import make_dataset

IMAGES, BATCH, EPOCHS = 320, 32, 5


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("mem"))
    make_dataset(path, images=IMAGES, classes=8, size=(96, 72), quality=85, seed=3, workers=1,
                 progress=False)
    return path


def _private_rss(pid: int) -> int:
    """RssAnon: resident private memory, without shared-memory batch buffers and mapped files."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


def _worker_rss(others: set[int]) -> dict[int, int]:
    """RssAnon of each child process but `others` (e.g. the resource tracker an earlier test started)."""
    return {p.pid: _private_rss(p.pid) for p in psutil.Process().children() if p.pid not in others}


def test_worker_rss_flat_over_five_epochs(root):
    loader = coordl.DataLoader(coordl.ImageFolder(root, "train"), batch_size=BATCH, shuffle=True,
                               num_workers=2, persistent_workers=True)
    per_epoch, others = [], {p.pid for p in psutil.Process().children()}
    for _ in range(EPOCHS + 1):  # epoch 0 warms up (imports, allocator pools)
        seen = sum(images.shape[0] for images, _labels in loader)
        assert seen == IMAGES
        per_epoch.append(_worker_rss(others))
    workers = set(per_epoch[1])
    assert len(workers) == 2 and all(set(e) == workers for e in per_epoch[1:])
    for pid in workers:
        growth = max(e[pid] for e in per_epoch[2:]) - per_epoch[1][pid]
        assert growth < 4 * 2**20, f"worker {pid} grew {growth / 2**20:.1f} MiB over {EPOCHS} epochs"
    assert loader.stats()["decodes"] == IMAGES * (EPOCHS + 1)
    assert loader.stats()["batch_buffers"] <= 2 * (2 + EXTRA_SLOTS)  # the shared part is bounded
    del loader
