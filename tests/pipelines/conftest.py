"""Pipeline fixtures: the encoded bytes of a bench-like sample (500x375 photos, 20% at 1500x1125)."""

from __future__ import annotations

import os

import pytest

from coordl.cli.make_dataset import make_dataset
from coordl.manifest.build import scan


@pytest.fixture(scope="session")
def bench_sample(tmp_path_factory) -> list[bytes]:
    """60 files made like the bench dataset, or every file of $COORDL_QUALITY_DATA."""
    root = os.environ.get("COORDL_QUALITY_DATA")
    if not root:
        root = str(tmp_path_factory.mktemp("bench-sample"))
        make_dataset(root, images=60, classes=60, seed=0, large_fraction=0.2, workers=1, progress=False)
    m = scan(root)
    out = []
    for i in range(len(m)):
        with open(m.path(i), "rb") as f:
            out.append(f.read())
    return out
