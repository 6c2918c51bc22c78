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
from objstore_common import S3Dataset, make_s3_dataset, objstore_proxy, s3server  # noqa: E402


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
