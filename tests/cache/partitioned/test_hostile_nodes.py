"""The partitioned cache client under hostile nodes and values (real redis-server processes).

Every case: no exception leaves the cache, nothing wrong is served, the fault is counted.
"""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest

from coordl.cache.partitioned import cache as partitioned
from coordl.cache.partitioned import redisnode
from coordl.cache.partitioned.cache import PartitionedCache
from coordl.cache.redact import redact_url
from coordl.errors import ConfigError
from coordl.loader.stats import Counters

FP = "c0ffee" * 10 + "abcd"
OTHER = "beef" * 16
N = 40


def _items(n: int = N, size: int = 5_000) -> list[bytes]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, size=size + 11 * i, dtype=np.uint8).tobytes() for i in range(n)]


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _faults(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("coordl") and r.levelno >= logging.WARNING]


# -- point 2: a value is bound to its dataset and item --

def test_a_value_copied_from_another_dataset_is_refused(redis_nodes):
    node = redis_nodes()
    mine, theirs = PartitionedCache([node.url], 0).open(FP, N), PartitionedCache([node.url], 0).open(OTHER, N)
    data, other = _items(), _items(size=6_000)
    for i in range(N):
        assert theirs.put(i, other[i])
    r = node.client()
    for i in range(5):                                         # same item number, another dataset's value
        r.set(mine.key(i), r.get(theirs.key(i)))
    counters = Counters(0)
    assert mine.get_many(range(N), counters) == {}
    assert counters.totals()["remote_errors"] == 5 and counters.totals()["local_hits"] == 0
    assert mine.put(5, data[5]) and bytes(mine.get(5)) == data[5]
    assert bytes(theirs.get(0)) == other[0]                     # the other dataset still reads its own


def test_the_header_binds_fingerprint_and_item():
    value = partitioned.pack(partitioned.binding(FP, 7), 7, b"payload")
    assert bytes(partitioned.unpack(partitioned.binding(FP, 7), 7, value)) == b"payload"
    assert partitioned.unpack(partitioned.binding(OTHER, 7), 7, value) is None
    assert partitioned.unpack(partitioned.binding(FP, 8), 8, value) is None


# -- point 3: any Redis error on a node is a node fault --

def test_a_read_only_replica_is_a_node_fault(redis_nodes, caplog):
    nodes = [redis_nodes() for _ in range(2)]
    data = _items()
    cache = PartitionedCache([n.url for n in nodes], 0, retry_after=0.0).open(FP, N)
    on_1 = [i for i in range(N) if cache.owner(i) == 1]
    nodes[1].client().execute_command("REPLICAOF", "127.0.0.1", str(_dead_port()))
    admitted = [i for i in range(N) if cache.put(i, data[i])]  # no exception: READONLY is a node fault
    assert set(admitted) == set(range(N)) - set(on_1)
    stats = cache.stats()
    assert stats["node_faults"] >= 1
    assert nodes[1].client().dbsize() == 1  # the node list record (coordl:members) only
    faults = _faults(caplog)
    assert len(faults) == 1 and "replica" in faults[0] and "REPLICAOF NO ONE" in faults[0]
    assert {i: bytes(v) for i, v in cache.get_many(range(N)).items()} == {i: data[i] for i in admitted}
    with pytest.raises(ConfigError, match=rf"{nodes[1].port}.*replica.*REPLICAOF NO ONE"):
        PartitionedCache([nodes[1].url], 0)                      # construction checks role:master


@pytest.mark.parametrize("poison", ["bytes lots", "items x1", "string"])
def test_a_poisoned_meta_hash_is_a_node_fault(redis_nodes, caplog, poison):
    node = redis_nodes()
    data = _items()
    cache = PartitionedCache([node.url], 0, retry_after=3600.0).open(FP, N)
    assert cache.put(0, data[0])
    r = node.client()
    if poison == "string":
        r.delete(cache.meta_key)
        r.set(cache.meta_key, b"not a hash")                   # WRONGTYPE for HGET/HINCRBY
    else:
        field, value = poison.split()
        r.hset(cache.meta_key, field, value)
    assert not cache.put(1, data[1])                           # refused before anything is written
    assert r.get(cache.key(1)) is None
    stats = cache.stats()                                      # no ValueError, no WRONGTYPE
    assert stats["nodes_down"] == 1 and stats["node_faults"] == 1
    assert not cache.put(2, data[2]) and cache.get_many(range(N)) == {}   # skipped while backing off
    faults = _faults(caplog)
    assert len(faults) == 1 and cache.meta_key in faults[0] and "drop" in faults[0]
    found = redisnode.datasets(r)                              # `coordl cache-node status` reads it
    assert "problem" in found[FP[:32]]
    fresh = PartitionedCache([node.url], 0, retry_after=0.0).open(FP, N)
    assert fresh.stats()["node_faults"] == 1                   # stats() reads the poisoned meta: a fault


def test_a_wrong_type_under_an_item_key_is_a_miss(redis_nodes):
    node = redis_nodes()
    data = _items()
    cache = PartitionedCache([node.url], 0).open(FP, N)
    r = node.client()
    r.hset(cache.key(3), "x", "1")
    counters = Counters(0)
    assert cache.get_many([3], counters) == {}
    assert not cache.put(3, data[3])                          # the key is there: never replaced
    assert cache.put(4, data[4]) and bytes(cache.get(4)) == data[4]


def test_a_node_restarted_with_allkeys_lru_is_skipped_and_rechecked(redis_nodes, caplog):
    nodes = [redis_nodes() for _ in range(2)]
    data = _items()
    cache = PartitionedCache([n.url for n in nodes], 0, retry_after=0.0).open(FP, N)
    for i in range(N):
        cache.put(i, data[i])
    on_1 = [i for i in range(N) if cache.owner(i) == 1]
    nodes[1].stop()
    nodes[1].start()                                           # same port, empty ...
    nodes[1].client().config_set("maxmemory-policy", "allkeys-lru")   # ... and now evicting
    counters = Counters(0)
    hits = cache.get_many(range(N), counters)                  # the reconnection re-checks the policy
    assert set(hits) == set(range(N)) - set(on_1)
    assert counters.totals()["remote_errors"] == 1
    assert not any(cache.put(i, data[i]) for i in on_1)
    assert nodes[1].client().dbsize() == 0                     # nothing written to an evicting node
    faults = _faults(caplog)
    assert len(faults) == 1 and "allkeys-lru" in faults[0] and "noeviction" in faults[0]
    assert cache.stats()["node_faults"] >= 2
    nodes[1].client().config_set("maxmemory-policy", "noeviction")
    assert cache.put(on_1[0], data[on_1[0]])                   # fixed: used again after the check
    assert bytes(cache.get(on_1[0])) == data[on_1[0]]


def test_a_full_node_is_not_a_fault(redis_nodes, caplog):
    node = redis_nodes(memory=3 * 2**20)
    data = _items(120, 20_000)
    cache = PartitionedCache([node.url], 0).open(FP, 120)
    admitted = [i for i in range(120) if cache.put(i, data[i])]   # OOM: admission stops, no exception
    assert 0 < len(admitted) < 120
    assert cache.stats()["nodes_down"] == 0 and cache.stats()["node_faults"] == 0
    assert _faults(caplog) == []


# -- point 5: one node, one name --

@pytest.mark.parametrize("a, b", [
    ("redis://localhost:7001", "redis://127.0.0.1:7001/0"),
    ("redis://:pw@LOCALHOST:7001/0", "redis://127.0.0.1:7001/"),
    ("redis://u:pw@Host.Example:7001/2", "rediss://host.example.:7001/?db=2"),
    ("redis://[::1]:7001/0", "redis://[0:0:0:0:0:0:0:1]:7001/0"),
    ("redis://h", "redis://h:6379/0"),
    ("unix:///tmp/x/../r.sock", "unix://:pw@/tmp/r.sock?db=0"),
    ("redis://127.0.0.1:7001/0", "redis://[::ffff:127.0.0.1]:7001/0"),      # IPv4-mapped IPv6
    ("redis://10.1.2.3:7001", "redis://[::FFFF:a01:203]:7001/0"),
    ("redis://127.0.0.1:7001/0", "redis://127.1:7001"),                      # inet_aton's short forms
    ("redis://10.0.0.5:7001/0", "redis://10.5:7001"),
    ("redis://127.0.0.1:7001/0", "redis://0x7f.0.0.1:7001/0"),
    ("redis://127.0.0.1:7001/0", "redis://0177.0.0.01:7001/0"),
    ("redis://127.0.0.1:7001/0", "redis://2130706433:7001/0"),
    ("redis://127.0.0.1:6379/0", "redis://[::ffff:7f00:1]"),
])
def test_one_node_one_name(a, b):
    assert redisnode.node_name(a) == redisnode.node_name(b)
    with pytest.raises(ConfigError, match="same node twice") as e:
        PartitionedCache([a, "redis://other:1/0", b], 0)
    shown = str(e.value)
    assert redact_url(a) in shown and redact_url(b) in shown and "pw" not in shown


@pytest.mark.parametrize("a, b", [
    ("redis://h:7001/0", "redis://h:7001/1"),
    ("redis://h:7001/0", "redis://h:7002/0"),
    ("redis://127.0.0.1:7001/0", "redis://127.0.0.2:7001/0"),
    ("redis://127.0.0.1:7001/0", "redis://[::ffff:127.0.0.2]:7001/0"),
    ("redis://127.1:7001/0", "redis://127.2:7001/0"),
    ("redis://127.0.0.256:7001/0", "redis://127.0.1.0:7001/0"),              # not an address: left as is
    ("redis://[::1]:7001/0", "redis://127.0.0.1:7001/0"),
])
def test_different_nodes_keep_different_names(a, b):
    assert redisnode.node_name(a) != redisnode.node_name(b)


@pytest.mark.parametrize("spelling", ["[::ffff:127.0.0.1]", "127.1", "0x7f.0.0.1"])
def test_a_real_node_under_two_address_spellings_is_one_node(redis_nodes, spelling):
    node = redis_nodes()
    other = f"redis://{spelling}:{node.port}/0"
    with pytest.raises(ConfigError, match="same node twice") as e:
        PartitionedCache([node.url, other], 0)
    assert node.url in str(e.value) and other in str(e.value)
    assert node.client().get("coordl:members") is None           # no list with both written on the node
    cache = PartitionedCache([other], 0).open(FP, N)             # the spelling alone reaches the node,
    assert cache.put(1, b"abc") and bytes(cache.get(1)) == b"abc"
    cache.close()                                                 # under its one name
    assert node.client().get("coordl:members") == f"127.0.0.1:{node.port}/0".encode()


@pytest.fixture
def two_address_node(tmp_path):
    """A redis-server bound to 127.0.0.1 and 127.0.0.2: one server that two addresses reach, which
    no rule of names can tell is one."""
    port = _dead_port()
    cfg = redisnode.NodeConfig(port=port, memory=64 * 2**20, bind="127.0.0.1 127.0.0.2")
    proc = redisnode.launch(cfg, str(tmp_path / "two-address"))
    try:
        redisnode.wait_ready(cfg.url, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("b", ["redis://127.0.0.2:{port}/0", "redis://127.0.0.1:{port}/1",
                               "redis://[::ffff:127.0.0.2]:{port}/3"])
def test_one_server_under_names_that_differ_is_refused_by_its_run_id(two_address_node, b):
    a, b = f"redis://127.0.0.1:{two_address_node}/0", b.format(port=two_address_node)
    assert redisnode.node_name(a) != redisnode.node_name(b)
    with pytest.raises(ConfigError, match="lists one server twice.*same redis-server.*run_id.*list each") as e:
        PartitionedCache([a, b], 0)
    assert a in str(e.value) and b in str(e.value)
    client = redisnode.redis_module().Redis.from_url(a)
    assert client.get("coordl:members") is None                  # refused before any list is written
    client.close()
    PartitionedCache([b], 0).close()                              # each alone is a node


def test_spellings_of_one_list_place_items_alike(redis_nodes):
    nodes = [redis_nodes() for _ in range(3)]
    plain = PartitionedCache([n.url for n in nodes], 0).open(FP, N)
    spelled = PartitionedCache([f"redis://localhost:{n.port}" for n in nodes], 0).open(FP, N)
    assert [plain.owner(i) for i in range(N)] == [spelled.owner(i) for i in range(N)]


@pytest.mark.parametrize("url", ["redis://h:port/0", "redis://h:1/x"])
def test_a_malformed_url_names_itself(url):
    with pytest.raises(ConfigError, match=r"nodes entry 'redis://h:"):
        PartitionedCache([url], 0)
