"""cache/storage/objstore.py's obstore GET path (cache/obstoreget.py) against the module's real moto
server: the same bytes and the same GET counts as s3fs for whole and ranged reads, the choice of
client (fetch_client, COORDL_S3_CLIENT, options obstore cannot take), 503s retried and counted by
storage.policy, deleted objects and wrong secrets as SampleErrors naming the URL without the
secret, and fork: a child of a parent that never used obstore reads through its own, a child of
one that did reads through s3fs (auto) or refuses (obstore), DataLoader workers read through it."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback

import pytest

from coordl.cache.storage import obstoreget
from coordl.cache.storage.objstore import ObjectStore
from coordl.errors import ConfigError, SampleError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import BUCKET, PREFIX, make_s3_dataset, s3server  # noqa: E402

pytest.importorskip("obstore")


def _store(s3, url_options: dict, client: str, **kw) -> ObjectStore:
    store = ObjectStore.from_url(s3.url, url_options, fetch_client=client, **kw)
    assert store.fetch_client == client, store.fetch_client_reason
    return store


def test_whole_and_ranged_reads_equal_s3fs_byte_for_byte_with_the_same_gets(s3, proxy):
    opts = s3.options(endpoint_url=proxy.url)
    keys = s3.keys
    sizes = [len(s3.local_bytes(k)) for k in keys]
    # inside, the tail (past the end: short), one byte, the whole object, length 0 (no request)
    ranges = [(k, n // 3, n // 4) for k, n in zip(keys, sizes)] + [
        (keys[0], sizes[0] - 10, 100), (keys[1], 0, 1), (keys[2], 0, sizes[2]), (keys[3], 5, 0)]
    got = {}
    for client in ("obstore", "s3fs"):
        with _store(s3, opts, client) as store:
            proxy.reset_counts()
            whole = store.read_many(keys)
            parts = store.read_ranges(ranges)
            futures = [f.result() for f in store.submit_many(keys[:5])]
            gets = len(keys) + len(ranges) - 1 + 5
            assert proxy.counts["GET"] == gets and dict(proxy.counts) == {"GET": gets}
            stats = store.stats()
            # every GET the server saw is counted once; an attempt that failed before reaching it is a
            # counted retry on top (once in a whole -n 2 run: 93 attempts, 1 retry, 92 GETs at the proxy)
            assert (stats["gets"] - stats["retries"], stats["objects"]) == (gets, len(keys) + 5)
            assert stats["bytes"] == sum(sizes) + sum(map(len, parts)) + sum(sizes[:5])
            got[client] = (whole, parts, futures)
    assert got["obstore"] == got["s3fs"]
    whole, parts, futures = got["obstore"]
    assert whole == [s3.local_bytes(k) for k in keys] and futures == whole[:5]
    assert parts == [s3.local_bytes(k)[o:o + n] for k, o, n in ranges]
    assert len(parts[-4]) == 10 and parts[-1] == b""


def test_auto_chooses_obstore_when_the_options_map_and_s3fs_naming_why_when_not(s3, monkeypatch):
    monkeypatch.delenv("COORDL_S3_CLIENT", raising=False)
    with ObjectStore.from_url(s3.url, s3.options()) as store:
        assert (store.config.fetch_client, store.fetch_client, store.fetch_client_reason) == ("auto", "obstore", "")
        assert "fetch_client='auto'" in repr(store)
    odd = s3.options(s3_additional_kwargs={"SSECustomerAlgorithm": "AES256"})
    with ObjectStore.from_url(s3.url, odd) as store:
        assert store.fetch_client == "s3fs" and "s3_additional_kwargs" in store.fetch_client_reason
        assert store.read(s3.keys[0]) == s3.local_bytes(s3.keys[0])
    with pytest.raises(ConfigError, match=r"s3://data/train: fetch_client='obstore'.*s3_additional_kwargs.*"
                                          r"pass fetch_client='auto' or 's3fs'"):
        ObjectStore.from_url(s3.url, odd, fetch_client="obstore")
    monkeypatch.setenv("COORDL_S3_CLIENT", "s3fs")
    with ObjectStore.from_url(s3.url, s3.options()) as store:
        assert store.fetch_client == "s3fs"
    monkeypatch.setenv("COORDL_S3_CLIENT", "boto")
    with pytest.raises(ConfigError, match=r"fetch_client='boto' is not valid: pass one of 'auto', 'obstore', 's3fs'"):
        ObjectStore.from_url(s3.url, s3.options())


def test_options_and_environment_map_as_botocore_reads_them():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK",
           "AWS_DEFAULT_REGION": "eu-west-1"}
    kwargs, why = obstoreget.s3_config("b/p", {}, env)
    assert why == "" and kwargs == {"bucket": "b", "client_options": {"allow_http": True}, "config": {
        "endpoint": "http://127.0.0.1:9", "region": "eu-west-1", "access_key_id": "AK", "secret_access_key": "SK"}}
    opts = {"key": "k", "secret": "s", "token": "t", "client_kwargs": {"endpoint_url": "https://e", "region_name": "r"}}
    kwargs, _ = obstoreget.s3_config("b", opts, env)
    assert kwargs is not None and kwargs["client_options"] == {} and kwargs["config"] == {
        "endpoint": "https://e", "region": "r", "access_key_id": "k", "secret_access_key": "s", "session_token": "t"}
    kwargs, _ = obstoreget.s3_config("b", {"anon": True, "endpoint_url": "http://x"}, {})
    assert kwargs is not None and kwargs["config"]["skip_signature"] is True and "access_key_id" not in kwargs["config"]
    for options, environ, why in [
            ({"profile": "dev"}, env, "['profile']"),
            ({"client_kwargs": {"proxies": {}}}, env, "['proxies']"),
            ({"key": "k", "secret": "s"}, {**env, "AWS_SESSION_TOKEN": "x"}, "AWS_SESSION_TOKEN"),
            ({}, {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}, "no region"),
            ({}, {**env, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"),
            ({"endpoint_url": "http://x"}, {}, "credentials from botocore's chain")]:
        kwargs, reason = obstoreget.s3_config("b", options, environ)
        assert kwargs is None and why in reason and "SK" not in reason


def test_503s_past_the_retries_and_ranged_reads(s3, proxy):
    with _store(s3, s3.options(endpoint_url=proxy.url), "obstore", retries=2) as store:
        proxy.reset_counts()
        proxy.inject(503, 3)
        key = s3.keys[0]
        with pytest.raises(SampleError, match=rf"s3://data/train/{key}: GET failed after 3 attempt\(s\) "
                                              r"\(S3ServerError: HTTP 503 Service Unavailable: SlowDown .*throttling"):
            store.read(key)
        assert proxy.counts["GET"] == 3 and store.stats()["retries"] == 2
        proxy.reset_counts()
        proxy.inject(503, 3)
        key = s3.keys[1]
        got = store.read_ranges([(key, 0, 10)], return_errors=True)
        assert isinstance(got[0], SampleError)
        assert f"s3://data/train/{key}: GET failed after 3 attempt(s)" in str(got[0])
        assert proxy.counts["GET"] == 3 and store.stats()["retries"] == 4


def test_submit_many_blocking_gets_retry_count_and_time_out_as_read_many(s3, proxy):
    """submit_many's obstore GETs (one blocking GET per thread, not the loop's): the same bytes, the
    same retries and counts (on_attempts before the future completes), the same SampleErrors; a store
    that stops answering is a TimeoutError after `timeout`, retried."""
    keys = s3.keys[:6]
    with _store(s3, s3.options(endpoint_url=proxy.url), "obstore", retries=2) as store:
        proxy.reset_counts()
        before = store.stats()  # the listing at construction counts too (and may retry on a loaded machine)
        proxy.inject(503, 2)  # fewer than an object's 3 attempts, whichever GETs they hit: all succeed
        attempts: list[int] = []
        futures = store.submit_many(keys, attempts.append)
        assert [f.result() for f in futures] == [s3.local_bytes(k) for k in keys]
        assert len(attempts) == len(keys) and sum(attempts) == len(keys) + 2 == proxy.counts["GET"]
        stats = {k: v - before[k] for k, v in store.stats().items() if k in ("gets", "retries", "objects", "bytes")}
        assert (stats["gets"], stats["retries"], stats["objects"]) == (len(keys) + 2, 2, len(keys))
        assert stats["bytes"] == sum(len(s3.local_bytes(k)) for k in keys)
        proxy.reset_counts()
        proxy.inject(503, 3)
        attempts.clear()
        with pytest.raises(SampleError, match=rf"s3://data/train/{keys[0]}: GET failed after 3 attempt\(s\) "
                                              r"\(S3ServerError: HTTP 503 Service Unavailable: SlowDown .*throttling"):
            store.submit_many(keys[:1], attempts.append)[0].result()
        assert attempts == [3] and proxy.counts["GET"] == 3 and store.stats()["retries"] - before["retries"] == 4
    # a short timeout only where the store hangs: elsewhere a loaded machine could pass 1 s and retry
    with _store(s3, s3.options(endpoint_url=proxy.url), "obstore", retries=2, timeout=1.0) as store:
        proxy.reset_counts()
        proxy.hang = True
        with pytest.raises(SampleError, match=rf"s3://data/train/{keys[1]}: GET failed after 3 attempt\(s\) "
                                              r"\(TimeoutError: no answer within timeout=1.0 s\)"):
            store.submit_many(keys[1:2])[0].result()
        assert proxy.counts["GET"] == 3


def test_object_deleted_after_listing_names_its_url(s3):
    with _store(s3, s3.options(), "obstore") as store:
        gone = s3.keys[3]
        client = s3.server.client()
        client.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{gone}")
        try:
            with pytest.raises(SampleError, match=rf"s3://data/train/{gone}: GET failed after 1 attempt.*"
                                                  r"FileNotFoundError: HTTP 404.*deleted"):
                store.read_many(s3.keys)
            got = store.read_many(s3.keys, return_errors=True)
            assert isinstance(got[3], SampleError)
            assert [g for i, g in enumerate(got) if i != 3] == [s3.local_bytes(k) for k in s3.keys if k != gone]
        finally:
            client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{gone}", Body=s3.local_bytes(gone))


@pytest.fixture(scope="module")
def auth(tiny_root, tmp_path_factory):
    """A moto server of its own with authentication on (it is server-wide)."""
    server = s3server.MotoServer().start()
    try:
        data = make_s3_dataset(server, tiny_root, tmp_path_factory)
        key, secret = s3server.enable_auth(server)
        yield data, key, secret
    finally:
        server.stop()


def test_wrong_secret_is_a_sample_error_that_does_not_show_it(auth):
    data, key, secret = auth
    with _store(data, data.options(key=key, secret=secret), "obstore") as store:
        assert store.read(data.keys[0]) == data.local_bytes(data.keys[0])
    bad = "WRONG-obstore-" + "secret-4321"
    with _store(data, data.options(key=key, secret=bad), "obstore", check=False) as store:
        with pytest.raises(SampleError) as info:
            store.read(data.keys[0])
        err = info.value
        shown = "".join(traceback.format_exception(err)) + repr(err) + repr(store)
        assert f"s3://data/train/{data.keys[0]}: GET failed after 1 attempt(s) (PermissionError: HTTP" in str(err)
        assert "AWS_SECRET_ACCESS_KEY" in str(err) and err.__cause__ is None and err.__context__ is None
        assert bad not in shown and key not in shown and secret not in shown


# -- fork --

def _in_child(work) -> dict:
    """Run work() in a forked child; its JSON answer (or the error's type and text) through a pipe.
    The child is killed if it does not answer in 60 s (obstore's inherited runtime hangs)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(r)
        try:
            out = {"ok": work()}
        except BaseException as e:  # noqa: BLE001
            out = {"error": type(e).__name__, "text": str(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 60)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return {"error": "hang"}
        return json.loads(os.read(r, 1 << 20) or b'{"error": "no answer"}')
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_a_child_of_a_process_that_used_obstore_falls_back_or_refuses(s3):
    """This (pytest) process has made obstore requests: its forked children cannot use obstore."""
    opts = s3.options()
    want = [s3.local_bytes(k).hex() for k in s3.keys[:3]]

    def read(store):
        return lambda: {"client": store.fetch_client, "data": [b.hex() for b in store.read_many(s3.keys[:3])],
                        "gets": store.stats()["gets"]}

    with ObjectStore.from_url(s3.url, opts) as auto, \
            ObjectStore.from_url(s3.url, opts, fetch_client="obstore") as strict:
        assert auto.read_many(s3.keys[:3]) == [bytes.fromhex(h) for h in want]  # this process's runtime starts
        assert obstoreget.runtime_started_here()
        assert _in_child(read(auto)) == {"ok": {"client": "s3fs", "data": want, "gets": 3}}
        refused = _in_child(read(strict))
        assert refused["error"] == "ConfigError" and "multiprocessing_context='spawn'" in refused["text"]
        assert auto.read(s3.keys[0]) == bytes.fromhex(want[0])  # the parent reads on


_FRESH = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
import torch
import coordl
from coordl.cache.storage import obstoreget
from coordl.cache.storage.objstore import ObjectStore
from test_obstore_client import _in_child
arg = json.loads(sys.argv[1])
out = {}
store = ObjectStore.from_url(arg["url"], arg["options"])
out["child"] = _in_child(lambda: [store.fetch_client, [b.hex() for b in store.read_many(arg["keys"])]])
ds = coordl.ImageFolder(arg["url"], transform="train", size=32, seed=3, storage_options=arg["options"])
local = coordl.ImageFolder(arg["root"], transform="train", size=32, seed=3)
remote_loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
local_loader = coordl.DataLoader(local, batch_size=8, shuffle=True, num_workers=2)
out["epochs"] = []
for _ in range(2):
    remote = [(x.clone(), y.clone()) for x, y in remote_loader]
    here = [(x.clone(), y.clone()) for x, y in local_loader]
    out["epochs"].append(len(remote) == len(here) > 0 and all(
        torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(remote, here)))
out["reads"] = [remote_loader.stats()["storage_reads"], 2 * len(ds)]
out["parent_used_obstore"] = obstoreget.runtime_started_here()
store.close()
del remote_loader, local_loader
print(json.dumps(out))
"""


def test_forked_children_and_dataloader_workers_read_through_their_own_obstore(s3):
    """A fresh process (python -c, COORDL_S3_CLIENT=obstore) that never makes an obstore request
    itself: a forked child reads through its own obstore; coordl.DataLoader's 2 forked workers read
    an s3:// ImageFolder for 2 epochs equal to the local batches. fetch_client='obstore' makes a
    worker that could not use obstore fail, never fall back, so equal batches mean obstore read them."""
    import subprocess

    arg = {"url": s3.url, "options": s3.options(), "root": s3.root, "keys": s3.keys[:3]}
    env = {**os.environ, "COORDL_S3_CLIENT": "obstore"}
    done = subprocess.run([sys.executable, "-c", _FRESH, json.dumps(arg), os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["child"] == {"ok": ["obstore", [s3.local_bytes(k).hex() for k in s3.keys[:3]]]}
    assert out["epochs"] == [True, True] and out["reads"][0] == out["reads"][1]
    assert out["parent_used_obstore"] is False


def test_imagefolder_passes_fetch_client_to_its_store(s3, monkeypatch):
    import coordl

    monkeypatch.delenv("COORDL_S3_CLIENT", raising=False)
    for client in ("s3fs", "obstore"):
        ds = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=s3.options(),
                                manifest_cache="off", fetch_client=client)
        assert ds.objects.store.fetch_client == client
        assert bytes(ds.fetch(0)) == s3.local_bytes(s3.keys[0])
    with pytest.raises(ConfigError, match="fetch_client"):
        coordl.ImageFolder(s3.url, storage_options=s3.options(), manifest_cache="off", fetch_client="boto")


def test_listed_sizes_make_ranged_gets_and_a_changed_object_is_read_whole(s3, proxy):
    """submit_many with each object's listed size: one ranged GET of bytes [0, size] each (one obstore
    call instead of two), the same bytes; after a rewrite, an object that grew is read again whole
    (a second GET, counted as a retry) and one that shrank comes whole from its one GET."""
    keys = s3.keys[:4]
    sizes = [len(s3.local_bytes(k)) for k in keys]
    client = s3.server.client()
    with _store(s3, s3.options(endpoint_url=proxy.url), "obstore") as store:
        proxy.reset_counts()
        attempts: list[int] = []
        got = [f.result() for f in store.submit_many(keys, attempts.append, sizes)]
        assert got == [s3.local_bytes(k) for k in keys]
        assert proxy.counts["GET"] == proxy.ranged == len(keys) and attempts == [1] * len(keys)
        grown, shrunk = keys[0], keys[1]
        bigger, smaller = s3.local_bytes(grown) + b"\0" * 10, s3.local_bytes(shrunk)[:-10]
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{grown}", Body=bigger)
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{shrunk}", Body=smaller)
        try:
            proxy.reset_counts()
            attempts.clear()
            before = store.stats()
            got = [f.result() for f in store.submit_many([grown, shrunk], attempts.append, sizes[:2])]
            assert got == [bigger, smaller]
            assert sorted(attempts) == [1, 2] and proxy.counts["GET"] == 3 and proxy.ranged == 2
            delta = {k: store.stats()[k] - before[k] for k in ("gets", "retries", "objects", "bytes")}
            assert delta == {"gets": 3, "retries": 1, "objects": 2, "bytes": len(bigger) + len(smaller)}
        finally:
            for k in (grown, shrunk):
                client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{k}", Body=s3.local_bytes(k))


def test_imagefolder_reads_each_object_with_one_ranged_get_of_its_listed_size(s3, proxy):
    import coordl

    ds = coordl.ImageFolder(s3.url, transform="val", size=32, storage_options=s3.options(endpoint_url=proxy.url),
                            manifest_cache="off", fetch_client="obstore")
    proxy.reset_counts()
    items = list(range(len(ds)))
    got = ds.objects.read_many(items)
    assert [bytes(got[i]) for i in items] == [s3.local_bytes(ds.objects.manifest.relpath(i)) for i in items]
    assert proxy.counts["GET"] == proxy.ranged == len(items) == len(s3.keys)
