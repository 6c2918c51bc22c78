"""`coordl cache-node start|stop|status` with real, daemonised redis-servers."""

from __future__ import annotations

import os
import socket

import pytest
import redis
from click.testing import CliRunner

from coordl.cache.partitioned import redisnode
from coordl.cli.commands import main
from coordl.errors import ConfigError
from coordl.loader.partitioned import PartitionedCache


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node_dir(tmp_path):
    """The --dir of the test's nodes; any node still running there at the end is stopped."""
    d = str(tmp_path / "nodes")
    yield d
    if os.path.isdir(d):
        for name in os.listdir(d):
            if name.endswith(".pid"):
                with open(os.path.join(d, name)) as f:
                    pid = int(f.read())
                redisnode.stop_pid(pid)
                assert not os.path.exists(f"/proc/{pid}"), f"cache node pid {pid} survived the test"


def _run(*args):
    return CliRunner().invoke(main, ["cache-node", *args], catch_exceptions=False)


def test_start_status_stop(node_dir):
    port = _free_port()
    r = _run("start", "--memory", "8MiB", "--port", str(port), "--dir", node_dir)
    assert r.exit_code == 0, r.output
    url = f"redis://127.0.0.1:{port}/0"
    assert r.output.splitlines()[0] == url
    client = redis.Redis.from_url(url)
    assert client.config_get("maxmemory") == {"maxmemory": str(8 * 2**20)}
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert client.config_get("save") == {"save": ""} and client.config_get("appendonly") == {"appendonly": "no"}
    assert client.config_get("protected-mode") == {"protected-mode": "yes"}
    again = _run("start", "--memory", "8MiB", "--port", str(port), "--dir", node_dir)
    assert again.exit_code == 2 and f"already runs on port {port}" in again.output
    s = _run("status", url)
    assert s.exit_code == 0 and "noeviction" in s.output and "datasets    none" in s.output
    cache = PartitionedCache([url], 0).open("5e" * 32, 10, label="/data/x")
    for i in range(3):
        assert cache.put(i, bytes([i]) * 1000)
    s = _run("status", url)
    assert "dataset     5e5e5e5e5e5e5e5e  3 keys of 10 items" in s.output and "/data/x" in s.output
    cache.close()
    client.close()
    stop = _run("stop", "--port", str(port), "--dir", node_dir)
    assert stop.exit_code == 0 and f"stopped cache node on port {port}" in stop.output
    gone = _run("status", url)
    assert gone.exit_code == 2 and "unreachable" in gone.output
    assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 2


def test_a_password_is_required_beyond_loopback_and_kept_out_of_argv(node_dir, tmp_path):
    r = _run("start", "--memory", "8MiB", "--bind", "0.0.0.0", "--port", str(_free_port()), "--dir", node_dir)
    assert r.exit_code == 2 and "without a password" in r.output and "--password-file" in r.output
    pw = tmp_path / "pw"
    pw.write_text("hunter2-long-secret\n")
    pw.chmod(0o600)
    port = _free_port()
    r = _run("start", "--memory", "8MiB", "--port", str(port), "--password-file", str(pw), "--dir", node_dir)
    assert r.exit_code == 0, r.output
    assert "hunter2" not in r.output and r.output.splitlines()[0] == f"redis://***@127.0.0.1:{port}/0"
    pid = redisnode.read_pid(redisnode.NodeConfig(port=port), node_dir)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert b"hunter2" not in f.read()
    with pytest.raises(ConfigError, match="password"):
        PartitionedCache([f"redis://127.0.0.1:{port}/0"], 0)
    PartitionedCache([f"redis://:hunter2-long-secret@127.0.0.1:{port}/0"], 0).close()
    assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 0


def test_bad_memory_and_missing_password_file(node_dir, tmp_path):
    r = _run("start", "--memory", "lots", "--dir", node_dir)
    assert r.exit_code == 2 and "--cache='lots' is not a size" in r.output  # --memory: the old name of --cache
    r = _run("start", "--memory", "8MiB", "--password-file", str(tmp_path / "nope"), "--dir", node_dir)
    assert r.exit_code == 2 and "cannot read it" in r.output
