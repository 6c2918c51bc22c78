"""cache/sizes.py: the one place sizes are read ('8GiB') and written ('8.0 GiB')."""

from __future__ import annotations

import pytest

import coordl
from coordl.cache import shm
from coordl.cache.minio import cache as minio
from coordl.cache.partitioned import cache as partitioned
from coordl.cache.sizes import fmt_bytes, fmt_mib, parse_size


@pytest.mark.parametrize("text,size", [
    ("8GiB", 8 * 2**30), ("8G", 8 * 2**30), ("8GB", 8 * 10**9), ("512 MiB", 512 * 2**20),
    ("1.5k", 1536), ("100", 100), (4096, 4096), ("2t", 2 * 2**40), ("3kb", 3000),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "8XB", "-1G", "0", 0, -3, 2.5, None, True])
def test_parse_size_names_the_parameter(bad):
    with pytest.raises(coordl.ConfigError, match="capacity_per_node="):
        parse_size(bad, "capacity_per_node")


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (3 * 2**20, "3.0 MiB"), (2**30, "1.0 GiB"),
    (2048 * 2**30, "2048.0 GiB"),
])
def test_fmt_bytes(n, text):
    assert fmt_bytes(n) == text


def test_fmt_mib_keeps_one_unit():
    assert fmt_mib(3 * 2**30) == "3072.0 MiB" and fmt_mib(2**19) == "0.5 MiB"


def test_one_formatter_everywhere():
    # shm's name is the same function, not a copy
    assert shm.fmt_bytes is fmt_bytes


def test_the_cache_classes_are_defined_once_and_take_size_strings():
    assert coordl.MinIOCache is minio.MinIOCache
    assert coordl.PartitionedCache is partitioned.PartitionedCache
    cache = coordl.MinIOCache("8MiB")
    assert cache.capacity == 8 * 2**20 and coordl.MinIOCache(4096).capacity == 4096
    with pytest.raises(coordl.ConfigError, match="capacity='lots'"):
        coordl.MinIOCache("lots")
    with pytest.raises(coordl.ConfigError, match="capacity=0"):
        coordl.MinIOCache(0)


def test_partitioned_capacity_refused_before_any_connection():
    # the size is checked before connecting: an unreachable URL is never dialled
    with pytest.raises(coordl.ConfigError, match="capacity_per_node='16 parsecs'"):
        coordl.PartitionedCache(["redis://127.0.0.1:1/0"], 0, capacity_per_node="16 parsecs")
