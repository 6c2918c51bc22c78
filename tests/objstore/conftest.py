"""Fixtures for the object-store tests: a real moto S3 server per module (tests/s3server.py), a
small real-JPEG ImageFolder uploaded to it, and a fault-injecting proxy (bench/lib/objstore_proxy.py)
per test. The server subprocess starts before the first test of a module and is stopped after
its last, so the autouse `no_leaks` of each test sees it neither appear nor linger.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import BENCH, S3Dataset, _load, make_s3_dataset, objstore_proxy, s3server  # noqa: E402


@pytest.fixture(scope="module")
def moto_server():
    server = s3server.MotoServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3(moto_server, tiny_root, tmp_path_factory) -> S3Dataset:
    return make_s3_dataset(moto_server, tiny_root, tmp_path_factory)


@pytest.fixture
def proxy(s3):
    """A FaultProxy in front of the module's server, no latency unless a test sets it."""
    p = objstore_proxy.FaultProxy(s3.server.url, latency=0.0).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def static():
    """bench/lib/objstore_static.py (the bench's S3 server: static objects, synthetic listings)."""
    return _load("coordl_bench_objstore_static", os.path.join(BENCH, "lib", "objstore_static.py"))


@pytest.fixture(scope="module")
def listing():
    """bench/lib/objstore_listing.py (a synthetic ImageNet-like bucket held in memory)."""
    return _load("coordl_bench_objstore_listing", os.path.join(BENCH, "lib", "objstore_listing.py"))
