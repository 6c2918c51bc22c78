"""`coordl cache-node` under hostile and unlucky use (issue 24): a busy port, a password with URL
characters in it, a stale pid file naming someone else's redis-server, auth and TLS mismatches.

Every server here is real: the nodes are daemonised by the command under test, the "unrelated"
servers are plain redis-server children of the test. The Debian service on :6379 is never touched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse

import pytest
import redis
from click.testing import CliRunner

from coordl.cache.partitioned import redisnode
from coordl.cache.shm import proc_start
from coordl.cli.commands import main

PASSWORD = "p@ss/w:rd#1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args):
    return CliRunner().invoke(main, ["cache-node", *args], catch_exceptions=False)


def _secret_pieces(password: str) -> set[str]:
    """The password, its percent-encoded form and every 4-character piece of either."""
    forms = {password, urllib.parse.quote(password, safe="")}
    return {f[i:i + n] for f in forms for n in (4, len(f)) for i in range(len(f) - n + 1)}


def _assert_no_secret(text: str, password: str = PASSWORD) -> None:
    leaked = sorted(p for p in _secret_pieces(password) if p in text)
    assert not leaked, f"password pieces {leaked} in output:\n{text}"


def _daemons_in(directory: str) -> list[int]:
    """Live processes whose working folder is `directory` (the nodes daemonised into it)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/cwd") == directory:
                    out.append(int(name))
            except OSError:
                pass
    return out


@pytest.fixture
def node_dir(tmp_path):
    """The --dir of the test's nodes; any daemon still running in it at the end is stopped (and the
    test fails: every test here must leave no node behind)."""
    d = str(tmp_path / "nodes")
    yield d
    left = _daemons_in(d)
    for pid in left:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _daemons_in(d) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"cache node(s) {left} left running in {d}"


@pytest.fixture
def other_redis(tmp_path):
    """start(port) -> an unrelated redis-server (a child of the test, not a coordl node) on `port`."""
    procs = []

    def start(port: int) -> subprocess.Popen:
        d = tmp_path / f"other{len(procs)}"
        d.mkdir()
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"], cwd=d, stdout=subprocess.DEVNULL)
        procs.append(proc)
        client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
        for _ in range(400):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        client.close()
        return proc

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


def _pw_file(tmp_path, password: str = PASSWORD) -> str:
    path = tmp_path / "pw"
    path.write_text(password + "\n")
    path.chmod(0o600)
    return str(path)


def test_start_refuses_a_port_where_another_redis_listens(node_dir, other_redis):
    port = _free_port()
    other = other_redis(port)
    r = _run("start", "--cache", "8MiB", "--port", str(port), "--dir", node_dir)
    assert r.exit_code != 0, r.output
    assert f"port {port}" in r.output and "in use" in r.output
    assert f"pid {other.pid}" in r.output and "redis-server" in r.output
    assert "--port" in r.output  # the fix
    assert other.poll() is None
    assert not _daemons_in(node_dir)


def test_start_refuses_a_port_held_by_any_listener(node_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run("start", "--cache", "8MiB", "--port", str(port), "--dir", node_dir)
    assert r.exit_code != 0, r.output
    assert f"port {port}" in r.output and f"pid {os.getpid()}" in r.output
    assert not _daemons_in(node_dir)


@pytest.mark.parametrize("password", [PASSWORD, ' p@ss "w\\o\'rd" %41 #é\t:/?x '])
def test_a_password_with_url_characters_works_and_is_never_printed(node_dir, tmp_path, password):
    port = _free_port()
    pw = _pw_file(tmp_path, password)
    outputs = []
    r = _run("start", "--cache", "8MiB", "--port", str(port), "--password-file", pw, "--dir", node_dir)
    outputs.append(r.output)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == f"redis://***@127.0.0.1:{port}/0"
    url = f"redis://:{urllib.parse.quote(password, safe='')}@127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    assert client.ping() and client.config_get("maxmemory") == {"maxmemory": str(8 * 2**20)}
    client.close()
    s = _run("status", url)
    outputs.append(s.output)
    assert s.exit_code == 0 and "noeviction" in s.output, s.output
    raw = f"redis://:{password}@127.0.0.1:{port}/0"  # not percent-encoded: refused, and not echoed
    s = _run("status", raw)
    outputs.append(s.output)
    assert s.exit_code != 0 and "percent-encode" in s.output, s.output
    stop = _run("stop", "--port", str(port), "--dir", node_dir)
    outputs.append(stop.output)
    assert stop.exit_code == 0, stop.output
    for out in outputs:
        _assert_no_secret(out, password)


def test_status_names_an_auth_failure(redis_nodes):
    node = redis_nodes(password=PASSWORD)
    port = node.port
    none = _run("status", f"redis://127.0.0.1:{port}/0")
    assert none.exit_code != 0 and "authentication failed" in none.output
    assert "requires a password" in none.output and "redis://:PASSWORD@" in none.output
    wrong = _run("status", f"redis://:not-it-{port}@127.0.0.1:{port}/0")
    assert wrong.exit_code != 0 and "authentication failed" in wrong.output and "wrong password" in wrong.output
    assert f"not-it-{port}" not in wrong.output
    for out in (none.output, wrong.output):
        assert "HELLO" not in out
        _assert_no_secret(out)


def test_status_names_a_tls_mismatch(redis_nodes):
    node = redis_nodes()
    s = _run("status", f"rediss://127.0.0.1:{node.port}/0")
    assert s.exit_code != 0 and "TLS mismatch" in s.output and "redis://" in s.output, s.output
    assert "firewall" not in s.output


def test_status_names_plain_redis_at_a_tls_server(tmp_path):
    """redis:// at a server that speaks only TLS (a redis-server with --tls-port, self-signed)."""
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        pytest.skip("no openssl to make a certificate")
    cert, key = str(tmp_path / "c.pem"), str(tmp_path / "k.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", cert, "--tls-key-file", key, "--tls-auth-clients", "no",
                             "--save", ""], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = redis.Redis.from_url(f"rediss://127.0.0.1:{port}/0", ssl_cert_reqs="none")
        for _ in range(400):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None:
                    pytest.skip(f"redis-server without TLS: {proc.stdout.read()[-200:]!r}")
                time.sleep(0.05)
        client.close()
        s = _run("status", f"redis://127.0.0.1:{port}/0")
        assert s.exit_code != 0 and "TLS mismatch" in s.output and "rediss://" in s.output, s.output
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_status_names_an_unreachable_node():
    s = _run("status", f"redis://:secret-{os.getpid()}@127.0.0.1:{_free_port()}/0")
    assert s.exit_code != 0 and "unreachable" in s.output and "cache-node start" in s.output, s.output
    assert f"secret-{os.getpid()}" not in s.output and "TLS" not in s.output


def test_stop_refuses_a_stale_pid_file_naming_another_redis(node_dir, other_redis):
    """The pid file left by a node killed with SIGKILL now names someone else's redis-server."""
    port, other_port = _free_port(), _free_port()
    other = other_redis(other_port)
    os.makedirs(node_dir)
    with open(redisnode.NodeConfig(port=port).pidfile(node_dir), "w") as f:
        f.write(f"{other.pid}\n")
    r = _run("stop", "--port", str(port), "--dir", node_dir)
    assert r.exit_code != 0, r.output
    assert other.poll() is None, "stop signalled an unrelated redis-server"
    assert f"pid {other.pid}" in r.output and "not signalled" in r.output
    # and `start` is not fooled by it either: it starts a node on the free port
    r = _run("start", "--cache", "8MiB", "--port", str(port), "--dir", node_dir)
    assert r.exit_code == 0, r.output
    assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 0
    assert other.poll() is None


def test_stop_refuses_a_reused_pid_or_another_port(node_dir, other_redis):
    """A record of a node whose pid now belongs to another process (other start time), or whose
    process listens on another port, is not proof: nothing is signalled."""
    port = _free_port()
    r = _run("start", "--cache", "8MiB", "--port", str(port), "--dir", node_dir)
    assert r.exit_code == 0, r.output
    cfg = redisnode.NodeConfig(port=port)
    pid = redisnode.read_pid(cfg, node_dir)
    assert pid is not None and f"pid {pid}" in r.output
    os.kill(pid, signal.SIGKILL)  # the node dies; its files stay
    while os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)
    other_port = _free_port()
    other = other_redis(other_port)
    record = cfg.recordfile(node_dir)
    with open(record) as f:
        mine = json.load(f)
    assert mine["pid"] == pid and mine["port"] == port
    # pid reuse: the record's pid is now the unrelated server's (its start time differs)
    with open(record, "w") as f:
        json.dump({**mine, "pid": other.pid}, f)
    with open(cfg.pidfile(node_dir), "w") as f:
        f.write(f"{other.pid}\n")
    r = _run("stop", "--port", str(port), "--dir", node_dir)
    assert r.exit_code != 0 and "not signalled" in r.output and "start time" in r.output, r.output
    assert other.poll() is None
    # right pid and start time, but the process listens on another port
    with open(record, "w") as f:
        json.dump({**mine, "pid": other.pid, "start": proc_start(other.pid)}, f)
    r = _run("stop", "--port", str(port), "--dir", node_dir)
    assert r.exit_code != 0 and "not signalled" in r.output and f":{port}" in r.output, r.output
    assert other.poll() is None


def test_cache_is_the_size_flag_and_memory_an_alias(node_dir):
    help_text = _run("start", "--help").output
    assert "--cache" in help_text and "--memory" in help_text
    for flag in ("--cache", "--memory"):
        port = _free_port()
        r = _run("start", flag, "8MiB", "--port", str(port), "--dir", node_dir)
        assert r.exit_code == 0, r.output
        client = redis.Redis(port=port)
        assert client.config_get("maxmemory") == {"maxmemory": str(8 * 2**20)}
        client.close()
        assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 0
    r = _run("start", "--cache", "lots", "--dir", node_dir)
    assert r.exit_code == 2 and "--cache='lots' is not a size" in r.output


def test_members_refuses_one_server_under_two_names(node_dir):
    """A node listening on two loopback addresses: `members --update` with both is one server twice
    (told by its INFO run_id), refused before any node list is written; 127.1 is 127.0.0.1 by name."""
    port = _free_port()
    r = _run("start", "--cache", "8MiB", "--port", str(port), "--bind", "127.0.0.1 127.0.0.2", "--dir", node_dir)
    assert r.exit_code == 0, r.output
    a, b = f"redis://127.0.0.1:{port}/0", f"redis://127.0.0.2:{port}/0"
    m = _run("members", "--update", a, b)
    assert m.exit_code != 0 and "lists one server twice" in m.output and a in m.output and b in m.output, m.output
    m = _run("members", "--update", a, f"redis://127.1:{port}")
    assert m.exit_code != 0 and "same node twice" in m.output, m.output
    client = redis.Redis(port=port)
    assert client.get("coordl:members") is None
    client.close()
    m = _run("members", "--update", b)
    assert m.exit_code == 0 and "1 node(s) now belong" in m.output, m.output
    assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 0
