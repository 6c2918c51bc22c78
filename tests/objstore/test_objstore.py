"""cache/storage/objstore.py against a real moto S3 server: listing order, bytes, exact request counts,
bounded concurrency, environment credentials, pickling and fork."""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import sys

import pytest
import torch

from coordl.cache.storage.objstore import ObjectStore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import local_walk  # noqa: E402


def test_listing_equals_a_local_copy_in_walk_order(s3, proxy):
    store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url))
    assert store.list_classes() == sorted(e.name for e in os.scandir(s3.root) if e.is_dir())
    proxy.reset_counts()
    infos = store.list_tree()
    assert [(o.key, o.size) for o in infos] == local_walk(s3.root)
    # the nested folder comes after its class's own files, though its keys sort first as strings
    keys = [o.key for o in infos]
    assert keys.index("class_0001/a_sub/img_a.jpg") > keys.index("class_0001/img_0000037.jpg")
    # ETag of a single-part upload is the MD5 of its bytes: the identity a manifest can key on
    assert all(o.etag == hashlib.md5(s3.local_bytes(o.key)).hexdigest() for o in infos)
    # list_tree: the classes' listing, then one listing per class prefix (each fits one page)
    assert proxy.counts["GET"] == 1 + 4
    # + the construction's listing of the root (list_classes above answered from it), counted as
    # listing calls: one per prefix (s3fs or obstore) + one for the root
    assert store.stats()["lists"] == 1 + 1 + 4
    store.close()


def test_read_many_is_byte_identical_with_exact_request_counts(s3, proxy):
    store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url))
    proxy.reset_counts()
    data = store.read_many(s3.keys)
    assert data == [s3.local_bytes(k) for k in s3.keys]
    assert dict(proxy.counts) == {"GET": len(s3.keys)}
    stats = store.stats()
    assert (stats["gets"], stats["retries"], stats["objects"]) == (len(s3.keys), 0, len(s3.keys))
    assert stats["bytes"] == sum(map(len, data))
    assert store.read_many([]) == [] and store.stats()["gets"] == len(s3.keys)
    store.close()


def test_requests_in_flight_are_bounded_and_concurrent(s3, proxy):
    proxy.latency = 0.05
    store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url), max_in_flight=4)
    proxy.reset_counts()
    store.read_many(s3.keys)
    assert 1 < proxy.max_in_flight <= 4
    store.close()


def test_aws_environment_variables_are_credentials_and_endpoint(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with ObjectStore.from_url(s3.url) as store:
        assert store.read(s3.keys[0]) == s3.local_bytes(s3.keys[0])
        assert s3.server.url in repr(store)


def test_pickled_store_reads_the_same(s3):
    store = ObjectStore.from_url(s3.url, s3.options())
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read_many(s3.keys[:5]) == store.read_many(s3.keys[:5])
    copy.close()
    store.close()


def test_file_urls_use_the_same_api(s3):
    with ObjectStore.from_url(f"file://{s3.root}") as store:
        assert [(o.key, o.size) for o in store.list_tree()] == local_walk(s3.root)
        assert store.read_many(s3.keys) == [s3.local_bytes(k) for k in s3.keys]


def _digest(chunks: list) -> bytes:
    return hashlib.sha256(b"".join(chunks)).digest()


def test_forked_child_reads_and_parent_keeps_reading(s3, proxy):
    """The child builds its own loop and client (the parent's are parked, never closed there); the
    parent's pooled connections still work after the child read, dropped its store and exited."""
    store = ObjectStore.from_url(s3.url, s3.options(endpoint_url=proxy.url))
    want = _digest([s3.local_bytes(k) for k in s3.keys])
    assert _digest(store.read_many(s3.keys)) == want
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report over the pipe, never return into pytest
        code = 1
        try:
            ok = _digest(store.read_many(s3.keys)) == want and store.stats()["gets"] == len(s3.keys)
            del store
            gc.collect()
            os.write(wfd, b"ok" if ok else b"bad")
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        answer = r.read()
    _, status = os.waitpid(pid, 0)
    assert (answer, os.waitstatus_to_exitcode(status)) == (b"ok", 0)
    proxy.reset_counts()
    assert _digest(store.read_many(s3.keys)) == want
    assert proxy.counts["GET"] == len(s3.keys)
    assert store.stats()["gets"] == 2 * len(s3.keys)  # the child's requests are the child's
    store.close()


class _Objects(torch.utils.data.Dataset):
    def __init__(self, store: ObjectStore, keys: list) -> None:
        self.store, self.keys = store, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> bytes:
        return self.store.read(self.keys[i])


def test_dataloader_fork_workers_read_objects(s3):
    store = ObjectStore.from_url(s3.url, s3.options())
    store.read(s3.keys[0])  # the parent's loop and client exist before the workers fork
    loader = torch.utils.data.DataLoader(_Objects(store, s3.keys), batch_size=8, num_workers=2,
                                         multiprocessing_context="fork", collate_fn=list)
    for _ in range(2):
        got = [b for batch in loader for b in batch]
        assert got == [s3.local_bytes(k) for k in s3.keys]
    assert store.read(s3.keys[1]) == s3.local_bytes(s3.keys[1])
    store.close()


@pytest.mark.parametrize("bad", [{"max_in_flight": 0}, {"timeout": 0}, {"retries": -1}])
def test_bad_arguments_name_the_parameter(s3, bad):
    from coordl.errors import ConfigError
    with pytest.raises(ConfigError, match=next(iter(bad))):
        ObjectStore.from_url(s3.url, s3.options(), **bad)
