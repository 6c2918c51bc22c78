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

from coordl.cache.partitioned import cache as partitioned
from coordl.cache.partitioned.cache import PartitionedCache
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


_CA_CONF = """[ca]
default_ca = d
[d]
database = index.txt
new_certs_dir = .
serial = serial.txt
default_md = sha256
policy = p
unique_subject = no
[p]
commonName = supplied
"""


def _dated(d, name: str, start: str, end: str, san: str = "DNS:localhost,IP:127.0.0.1") -> tuple[str, str]:
    """A certificate signed by CA "ca" with the given notBefore/notAfter (YYYYMMDDHHMMSSZ): `openssl
    ca` sets any dates (`x509 -req` only counts days from now)."""
    key, csr, crt, ext = (str(d / f"{name}.{x}") for x in ("key", "csr", "pem", "ext"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}", cwd=d)
    (d / "ca.cnf").write_text(_CA_CONF)
    if not (d / "index.txt").exists():
        (d / "index.txt").write_text("")
        (d / "serial.txt").write_text("1000\n")
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in", csr, "-out", crt,
             "-notext", "-startdate", start, "-enddate", end, "-extfile", ext, cwd=d)
    return crt, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate signed by it, and
    a second CA that signed neither; server and client certificates signed by the CA that expired
    on 2021-01-01 or are valid only from 2031-01-01."""
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        pytest.skip("no openssl to make certificates")
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "1", "-subj", f"/CN=coordl test {ca}", cwd=d)
    server = _signed(d, "ca", "server", "DNS:localhost,IP:127.0.0.1")
    client = _signed(d, "ca", "client", "")
    return {"ca": str(d / "ca.pem"), "other_ca": str(d / "other-ca.pem"), "server": server, "client": client,
            "expired": _dated(d, "expired", "20200101000000Z", "20210101000000Z"),
            "future": _dated(d, "future", "20310101000000Z", "20320101000000Z"),
            "expired_client": _dated(d, "expired-client", "20200101000000Z", "20210101000000Z", "DNS:client")}


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


# -- issue 35 point 5: certificate dates --

EXPIRED = "expired on 2021-01-01 00:00:00 UTC (notBefore 2020-01-01 00:00:00 UTC, notAfter 2021-01-01 00:00:00 UTC"
FUTURE = ("is not yet valid: valid from 2031-01-01 00:00:00 UTC (notBefore 2031-01-01 00:00:00 UTC, "
          "notAfter 2032-01-01 00:00:00 UTC")


@pytest.mark.parametrize("which, dates", [("expired", EXPIRED), ("future", FUTURE)])
def test_start_refuses_a_certificate_out_of_its_dates(node_dir, pki, which, dates):
    cert, key = pki[which]
    r = _run("start", "--cache", "8MiB", "--port", str(_free_port()), "--dir", node_dir,
             "--tls-cert", cert, "--tls-key", key)
    assert r.exit_code != 0, r.output
    assert f"--tls-cert {cert}: the server certificate" in r.output and dates in r.output, r.output
    assert "reissue it" in r.output
    assert not _daemons_in(node_dir)


@pytest.fixture
def dated_node(tmp_path, pki):
    """start(which) -> the port of a TLS redis-server (a child) showing certificate pki[which]: the
    server `cache-node start` now refuses to start, as another tool would start it."""
    from coordl.cache.partitioned import redisnode

    procs = []

    def start(which: str) -> int:
        cert, key = pki[which]
        cfg = redisnode.NodeConfig(port=_free_port(), memory=16 * 2**20, tls_cert=cert, tls_key=key)
        procs.append(redisnode.launch(cfg, str(tmp_path / f"{which}-node")))
        redisnode.wait_ready(cfg.url, procs[-1], tls={"ssl_cert_reqs": "none"})
        return cfg.port

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("which, dates", [("expired", EXPIRED), ("future", FUTURE)])
def test_a_client_names_a_server_certificate_out_of_its_dates(dated_node, pki, which, dates):
    port = dated_node(which)
    url = f"rediss://localhost:{port}/0"
    with pytest.raises(ConfigError) as e:
        PartitionedCache([url], 0, ssl_ca_certs=pki["ca"], timeout=2.0)
    msg = str(e.value)
    assert f"the server's certificate at localhost:{port} {dates}" in msg and "reissue" in msg, msg
    assert "not signed by a CA" not in msg
    s = _run("status", url, "--tls-ca", pki["ca"])                  # the same, from the command line
    assert s.exit_code != 0 and dates in s.output, s.output


def test_an_expired_client_certificate_is_refused_before_connecting(pki):
    cert, key = pki["expired_client"]
    with pytest.raises(ConfigError, match=rf"ssl_certfile= {cert}: the client certificate {EXPIRED[:30]}"):
        partitioned.nodetls.options(["rediss://127.0.0.1:1/0"], pki["ca"], cert, key)
    assert partitioned.nodetls.options(["rediss://127.0.0.1:1/0"], pki["ca"], *pki["client"])
    with pytest.raises(ConfigError, match="holds no certificate"):
        partitioned.nodetls.options(["rediss://127.0.0.1:1/0"], pki["ca"], pki["client"][1], pki["client"][1])


def test_certificate_dates_are_read_in_both_time_forms(tmp_path, pki):
    """UTCTime (years to 2049) and GeneralizedTime (from 2050), as openssl writes them."""
    import datetime as dt
    import shutil

    from coordl.cache.partitioned import certdates

    d = tmp_path / "far"
    shutil.copytree(os.path.dirname(pki["ca"]), d)
    cert, _ = _dated(d, "far", "20400101000000Z", "20510203040506Z")
    with open(cert) as f:
        (der,) = certdates.pem_certificates(f.read())
    utc = dt.timezone.utc
    assert certdates.validity(der) == (dt.datetime(2040, 1, 1, tzinfo=utc),
                                       dt.datetime(2051, 2, 3, 4, 5, 6, tzinfo=utc))
    assert certdates.date_problem(der, now=dt.datetime(2045, 1, 1, tzinfo=utc)) is None
    assert certdates.date_problem(der, now=dt.datetime(2052, 1, 1, tzinfo=utc)).startswith(
        "expired on 2051-02-03 04:05:06 UTC")
    for bad in (der[:40], b"\x30\x03\x02\x01\x01", b""):
        with pytest.raises(ValueError):
            certdates.validity(bad)
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match=rf"ssl_certfile= {broken}: cannot read the client certificate"):
        partitioned.nodetls.options(["rediss://127.0.0.1:1/0"], None, str(broken), None)
