"""coordl/datasets/daliflow.py: the DALI fetch -> settle -> labels flow shared by the DALI loader
and the daemon's DALI workers, on a real ImageFolder (DALI itself is not needed: `settle` takes
the decoder's errors by position, as pipelines/dali.Prep reports them)."""

from __future__ import annotations

import collections
import os
import shutil

import pytest

import coordl
from coordl.datasets import daliflow
from coordl.errors import DecodeError
from coordl.loader.dali import dali_epoch


class _Counts:
    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def add(self, **amounts: int) -> None:
        self.counts.update(amounts)


@pytest.fixture
def ds(tiny_root, tmp_path):
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    out = coordl.ImageFolder(root, transform="val", size=32, on_error="skip", manifest_cache="off")
    os.remove(out.manifest.path(2))  # gone after the scan: its read fails
    return out.bind(counters=_Counts())


def test_skip_counts_each_bad_item_once_and_keeps_the_rest_in_order(ds):
    raws, items = daliflow.fetch(ds, [0, 1, 2, 3, 4])
    assert items == [0, 1, 3, 4] and len(raws) == 4
    kept = daliflow.settle(ds, items, [0, 2, 3], {1: DecodeError("truncated")})  # item 1: DALI failed
    assert kept == [0, 3, 4]
    assert ds.counters.counts == {"errors_skipped": 2, "decodes": 4, "samples": 3, "storage_reads": 4,
                                  "storage_bytes": sum(len(r) for r in raws)}
    assert daliflow.labels_of(ds, kept).tolist() == [int(ds.manifest.labels[i]) for i in kept]
    assert daliflow.labels_of(ds, kept).dtype.name == "int64"


def test_raise_names_the_file_of_a_read_error(ds):
    ds.on_error = "raise"
    with pytest.raises(coordl.SampleError, match=f"{ds.manifest.path(2)}: cannot read the file.*on_error='skip'"):
        daliflow.fetch(ds, [0, 1, 2])


def test_raise_names_the_file_of_a_decode_error(ds):
    ds.on_error = "raise"
    with pytest.raises(coordl.SampleError, match=f"{ds.manifest.path(3)}: truncated: replace or remove"):
        daliflow.settle(ds, [0, 3], [0], {1: DecodeError("truncated")})
    assert "samples" not in ds.counters.counts


def test_the_dali_loader_refuses_a_dataset_that_only_looks_like_one(tiny_root):
    pytest.importorskip("nvidia.dali")
    real = coordl.ImageFolder(tiny_root, transform="val", size=32)

    class Lookalike:  # every attribute the old duck test asked for, and not a coordl dataset
        fetch, manifest, transform, size, seed, on_error = real.fetch, real.manifest, "val", 32, 0, "raise"

        def __len__(self) -> int:
            return len(real)

        def __getitem__(self, i):
            return real[i]

    with pytest.raises(coordl.ConfigError, match="backend='dali' needs a coordl dataset.*Lookalike"):
        coordl.DataLoader(Lookalike(), batch_size=4, backend="dali")
    loader = coordl.DataLoader(real, batch_size=4, backend="dali")  # the DALI epoch asks again, by class
    with pytest.raises(coordl.ConfigError, match="backend='dali' needs a coordl dataset.*Lookalike"):
        dali_epoch(loader, loader.batch_sampler, Lookalike())
