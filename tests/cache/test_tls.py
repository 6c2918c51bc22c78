"""TLS and ACL users on cache nodes (issue 28 point 4), against real redis-servers started by
`coordl cache-node start`, with a CA, a server and a client certificate made here by openssl."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.parse

import pytest
import redis
from click.testing import CliRunner

from coordl.cache import partitioned
from coordl.cache.partitioned import PartitionedCache
from coordl.cli.commands import main
from coordl.errors import ConfigError

FP = "7e57" * 16
PASSWORD = "tls p@ss/w:rd#9"
USER = "trainer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(d, ca: str, name: str, san: str) -> tuple[str, str]:
    key, csr, crt, ext = (str(d / f"{name}.{x}") for x in ("key", "csr", "pem", "ext"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}", cwd=d)
    with open(ext, "w") as f:
        f.write(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", csr, "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", crt, "-days", "1", "-extfile", ext, cwd=d)
    return crt, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate signed by it, and
    a second CA that signed neither."""
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        pytest.skip("no openssl to make certificates")
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "1", "-subj", f"/CN=coordl test {ca}", cwd=d)
    server = _signed(d, "ca", "server", "DNS:localhost,IP:127.0.0.1")
    client = _signed(d, "ca", "client", "")
    return {"ca": str(d / "ca.pem"), "other_ca": str(d / "other-ca.pem"), "server": server, "client": client}


def _daemons_in(directory: str) -> list[int]:
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
    d = str(tmp_path / "nodes")
    yield d
    left = _daemons_in(d)
    for pid in left:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _daemons_in(d) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"cache node(s) {left} left running in {d}"


def _run(*args):
    return CliRunner().invoke(main, ["cache-node", *args], catch_exceptions=False)


def _no_secret(text: str) -> None:
    for form in (PASSWORD, urllib.parse.quote(PASSWORD, safe="")):
        for i in range(len(form) - 3):
            assert form[i:i + 4] not in text, f"password piece {form[i:i + 4]!r} in:\n{text}"


def _start(node_dir, tmp_path, pki, *extra: str) -> tuple[int, str]:
    port = _free_port()
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    r = _run("start", "--cache", "16MiB", "--port", str(port), "--dir", node_dir,
             "--tls-cert", pki["server"][0], "--tls-key", pki["server"][1], "--password-file", str(pw), *extra)
    if r.exit_code != 0 and "TLS" in r.output and "not" in r.output.lower() and "support" in r.output.lower():
        pytest.skip(f"redis-server built without TLS: {r.output[-200:]}")
    assert r.exit_code == 0, r.output
    _no_secret(r.output)
    return port, r.output


def test_mutual_tls_with_an_acl_user_end_to_end(node_dir, tmp_path, pki):
    port, out = _start(node_dir, tmp_path, pki, "--tls-ca", pki["ca"], "--user", USER)
    assert out.splitlines()[0] == f"rediss://***@127.0.0.1:{port}/0", out
    assert "TLS only" in out and f"ACL user {USER}" in out
    url = f"rediss://{USER}:{urllib.parse.quote(PASSWORD, safe='')}@127.0.0.1:{port}/0"
    tls = {"ssl_ca_certs": pki["ca"], "ssl_certfile": pki["client"][0], "ssl_keyfile": pki["client"][1]}
    cache = PartitionedCache([url], 0, **tls).open(FP, 10, "tls")
    data = [bytes([i]) * (100 + i) for i in range(10)]
    assert all(cache.put(i, raw) for i, raw in enumerate(data))
    assert {i: bytes(v) for i, v in cache.get_many(range(10)).items()} == dict(enumerate(data))
    assert cache.stats()["cache_items"] == 10 and cache.stats()["node_faults"] == 0
    assert cache.drop() == 11                                         # the items and the meta hash
    assert "***" in repr(cache) and PASSWORD not in repr(cache)
    cache.close()
    # the user holds only coordl's commands on coordl:* keys; the default user is off
    client = redis.Redis.from_url(url, **tls)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.set("someone-else:key", b"x")
    client.close()
    anonymous = f"rediss://:{urllib.parse.quote(PASSWORD, safe='')}@127.0.0.1:{port}/0"
    with pytest.raises(ConfigError, match="authentication failed|WRONGPASS|NOAUTH|invalid username"):
        PartitionedCache([anonymous], 0, **tls)
    # status and members over TLS with the client certificate
    flags = ["--tls-ca", pki["ca"], "--tls-cert", pki["client"][0], "--tls-key", pki["client"][1]]
    s = _run("status", url, *flags)
    assert s.exit_code == 0 and "noeviction" in s.output, s.output
    wrong = _run("status", url.replace(USER, "mallory"), *flags)
    assert wrong.exit_code != 0 and "wrong user or password" in wrong.output, wrong.output
    _no_secret(wrong.output)
    m = _run("members", url, *flags)
    assert m.exit_code == 0 and "node list: same" in m.output, m.output
    for text in (s.output, m.output):
        _no_secret(text)
    assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 0


def test_tls_client_problems_are_named_at_construction(node_dir, tmp_path, pki):
    port, _ = _start(node_dir, tmp_path, pki, "--tls-ca", pki["ca"])
    pw = urllib.parse.quote(PASSWORD, safe="")
    url = f"rediss://:{pw}@127.0.0.1:{port}/0"
    with pytest.raises(ConfigError, match="requires a client certificate.*ssl_certfile") as e:
        PartitionedCache([url], 0, ssl_ca_certs=pki["ca"], timeout=2.0)
    _no_secret(str(e.value))
    with pytest.raises(ConfigError, match="not signed by a CA this client trusts.*ssl_ca_certs"):
        PartitionedCache([url], 0, ssl_ca_certs=pki["other_ca"], ssl_certfile=pki["client"][0],
                         ssl_keyfile=pki["client"][1], timeout=2.0)
    with pytest.raises(ConfigError, match="TLS mismatch.*expects TLS.*rediss://") as e:
        PartitionedCache([f"redis://:{pw}@127.0.0.1:{port}/0"], 0, timeout=2.0)
    _no_secret(str(e.value))
    s = _run("status", url, "--tls-ca", pki["ca"])                  # the same, from the command line
    assert s.exit_code != 0 and "requires a client certificate" in s.output, s.output
    s = _run("status", f"redis://:{pw}@127.0.0.1:{port}/0")
    assert s.exit_code != 0 and "TLS mismatch" in s.output and "rediss://" in s.output, s.output
    for text in (s.output,):
        _no_secret(text)
    assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 0


def test_rediss_at_a_plain_server_is_a_tls_mismatch(redis_nodes, pki):
    node = redis_nodes()
    with pytest.raises(ConfigError, match="TLS mismatch.*asks for TLS.*speaks plain Redis.*redis://"):
        PartitionedCache([node.url.replace("redis://", "rediss://")], 0, ssl_ca_certs=pki["ca"], timeout=2.0)


def test_tls_without_client_certificates(node_dir, tmp_path, pki):
    """--tls-cert/--tls-key alone: TLS, the server verified by the client, no client certificate."""
    port, out = _start(node_dir, tmp_path, pki)
    assert out.splitlines()[0] == f"rediss://***@127.0.0.1:{port}/0" and "clients need" not in out
    url = f"rediss://:{urllib.parse.quote(PASSWORD, safe='')}@localhost:{port}/0"
    cache = PartitionedCache([url], 0, ssl_ca_certs=pki["ca"]).open(FP, 3)
    assert cache.put(1, b"abc") and bytes(cache.get(1)) == b"abc"
    cache.close()
    assert _run("stop", "--port", str(port), "--dir", node_dir).exit_code == 0


def test_tls_options_are_checked(tmp_path, pki):
    with pytest.raises(ConfigError, match="no node URL is rediss://"):
        partitioned.nodetls.options(["redis://127.0.0.1:1/0"], pki["ca"], None, None)
    with pytest.raises(ConfigError, match="ssl_certfile=.*not a readable file"):
        partitioned.nodetls.options(["rediss://127.0.0.1:1/0"], None, str(tmp_path / "nope.pem"), None)
    with pytest.raises(ConfigError, match="ssl_keyfile= was given without ssl_certfile="):
        partitioned.nodetls.options(["rediss://127.0.0.1:1/0"], None, None, pki["client"][1])
    r = _run("start", "--cache", "8MiB", "--tls-cert", pki["server"][0], "--port", str(_free_port()))
    assert r.exit_code != 0 and "--tls-cert and --tls-key go together" in r.output
    r = _run("start", "--cache", "8MiB", "--user", "bob", "--port", str(_free_port()))
    assert r.exit_code != 0 and "--user bob needs --password-file" in r.output
