"""coordl.PartitionedCache: bad nodes and bad arguments are clear errors at construction."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from coordl.errors import ConfigError
from coordl.loader.partitioned import PartitionedCache


def test_wrong_or_missing_password(redis_nodes):
    node = redis_nodes(password="s3cret")
    with pytest.raises(ConfigError, match=rf"127.0.0.1:{node.port}.*(password|NOAUTH|auth)"):
        PartitionedCache([f"redis://127.0.0.1:{node.port}/0"], 0)
    with pytest.raises(ConfigError, match=r"\*\*\*@127.0.0.1.*authentication failed.*redis://:PASSWORD@") as e:
        PartitionedCache([f"redis://:wrong@127.0.0.1:{node.port}/0"], 0)
    assert "wrong" not in str(e.value)                      # the password is never printed
    PartitionedCache([node.url], 0)


def test_unknown_host():
    with pytest.raises(ConfigError, match=r"no-such-host.invalid:6390.*unknown host.*host name"):
        PartitionedCache(["redis://no-such-host.invalid:6390/0"], 0, timeout=5.0)


def test_closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=rf"127.0.0.1:{port}.*refused.*coordl cache-node start"):
        PartitionedCache([f"redis://127.0.0.1:{port}/0"], 0)


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_a_server_that_is_not_redis():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Quiet)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        url = f"redis://127.0.0.1:{httpd.server_address[1]}/0"
        with pytest.raises(ConfigError, match=rf"{url} does not answer as a Redis server"):
            PartitionedCache([url], 0, timeout=2.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join()


def test_a_server_that_never_answers():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)                                         # accepts the connection, never replies
        url = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
        with pytest.raises(ConfigError, match=rf"{url} did not answer within timeout=0.2s"):
            PartitionedCache([url], 0, timeout=0.2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(nodes="redis://a:1/0", node_rank=0), "list of Redis URLs"),
    (dict(nodes=[], node_rank=0), "list of Redis URLs"),
    (dict(nodes=["http://a:1/"], node_rank=0), "not a Redis URL"),
    (dict(nodes=["redis://a:1/0", "redis://:pw@a:1/0"], node_rank=0), "same node twice"),
    (dict(nodes=["redis://a:1/0"], node_rank=1), r"node_rank=1 must be an int in \[0, 1\)"),
    (dict(nodes=["redis://a:1/0"], node_rank=0, capacity_per_node="lots"), "capacity_per_node='lots'"),
    (dict(nodes=["redis://a:1/0"], node_rank=0, timeout=0), "timeout=0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PartitionedCache(**kwargs)


def test_size_strings(redis_nodes):
    node = redis_nodes()
    cache = PartitionedCache([node.url], 0, capacity_per_node="16MiB").open("ab" * 32, 10)
    assert cache.capacity_per_node == 16 * 2**20 and cache.stats()["cache_capacity"] == 16 * 2**20
