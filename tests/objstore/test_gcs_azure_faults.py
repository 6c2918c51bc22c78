"""The object-store faults over gs:// (gcsfs against gcp-storage-emulator) and az:// (adlfs against
Azurite), each a real server of this module (tests/objservers.py), with a FaultProxy
(bench/lib/objstore_proxy.py) in front where a fault is injected: a missing bucket / container and
wrong credentials are coordl errors at construction naming the URL and the fix (no secret); an
object deleted after listing is a SampleError naming its URL, or skipped with on_error="skip";
injected 503s are retried by coordl alone (gcsfs's and the Azure SDK's own retries are off) and
counted; a silent store times out; a store killed mid-epoch is a SampleError within 60 s. The s3://
equivalents are in test_objstore_faults.py and test_imagefolder_s3.py. Counts, not clocks (the
only time bound is the issue's 60 s)."""

from __future__ import annotations

import os
import sys

import pytest

import coordl
from coordl.cache.storage.objstore import ObjectStore
from coordl.errors import ConfigError, DatasetError, SampleError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coordl_tests_loaderhelp import epoch_counts  # noqa: E402
from objstore_common import BUCKET, PREFIX, TESTS, _load, objstore_proxy  # noqa: E402
from test_imagefolder_s3 import killed_mid_epoch_fails_within_a_minute  # noqa: E402

objservers = _load("coordl_tests_objservers", os.path.join(TESTS, "objservers.py"))
SCHEMES = {"gs": ("gcsfs", objservers.GcsEmulator), "az": ("adlfs", objservers.Azurite)}
#: What a wrong credential's error must tell the user to check, per scheme.
CREDENTIALS = {"gs": "storage_options token", "az": "storage_options connection_string"}


def _server(scheme: str):
    package, server_cls = SCHEMES[scheme]
    pytest.importorskip(package)
    if scheme == "az" and objservers.azurite_command() is None:
        pytest.skip(objservers.AZURITE_MISSING)
    return server_cls().start()


class Store:
    """A server of this module with tiny_root uploaded under data/train."""

    def __init__(self, scheme: str, server, root: str) -> None:
        self.scheme, self.server, self.root = scheme, server, root
        self.url = f"{scheme}://{BUCKET}/{PREFIX}"
        self.keys = objservers.upload_folder(server, BUCKET, root, PREFIX)

    def options(self, endpoint_url: str | None = None) -> dict:
        return self.server.options(endpoint_url)

    def local_bytes(self, key: str) -> bytes:
        with open(os.path.join(self.root, key), "rb") as f:
            return f.read()

    def delete(self, key: str) -> None:
        self.server.filesystem().rm(f"{BUCKET}/{PREFIX}/{key}")

    def restore(self, key: str) -> None:
        self.server.filesystem().pipe({f"{BUCKET}/{PREFIX}/{key}": self.local_bytes(key)})


@pytest.fixture(scope="module", params=sorted(SCHEMES))
def store(request, tiny_root):
    server = _server(request.param)
    try:
        yield Store(request.param, server, tiny_root)
    finally:
        server.stop()


@pytest.fixture
def proxy(store):
    p = objstore_proxy.FaultProxy(store.server.url, latency=0.0).start()
    yield p
    p.stop()


def test_missing_bucket_and_wrong_credentials_are_named_at_construction(store, proxy):
    """Azurite checks the account key (a wrong one: 403 AuthorizationFailure); the GCS emulator checks
    none, so its 403 is the proxy's, answered to the first listing request."""
    with pytest.raises(DatasetError, match=rf"{store.scheme}://nope/train: bucket 'nope' does not exist"):
        ObjectStore.from_url(f"{store.scheme}://nope/{PREFIX}", store.options())
    wrong = "A" * 86 + "=="
    if store.scheme == "az":
        options = {"connection_string": store.server.connection_string(proxy.url).replace(objservers.AZURE_KEY, wrong)}
    else:
        options = store.options(proxy.url)
        proxy.inject(403, 1)
    proxy.reset_counts()
    with pytest.raises(ConfigError, match=rf"(?s){store.url}: access denied .*{CREDENTIALS[store.scheme]}") as caught:
        ObjectStore.from_url(store.url, options)
    assert wrong not in str(caught.value) and objservers.AZURE_KEY not in str(caught.value)
    assert proxy.counts["GET"] == 1  # not retried


def test_object_deleted_after_listing_names_its_url(store):
    with ObjectStore.from_url(store.url, store.options()) as objects:
        keys = [o.key for o in objects.list_tree()]
        assert keys == store.keys or sorted(keys) == store.keys
        gone = keys[3]
        store.delete(gone)
        try:
            with pytest.raises(SampleError, match=rf"{store.url}/{gone}: GET failed after 1 attempt.*deleted"):
                objects.read_many(keys)
            got = objects.read_many(keys, return_errors=True)
            assert isinstance(got[3], SampleError) and gone in str(got[3])
            assert [g for i, g in enumerate(got) if i != 3] == [store.local_bytes(k) for k in keys if k != gone]
        finally:
            store.restore(gone)


@pytest.mark.slow
def test_object_deleted_after_listing_is_skipped_by_a_loader(store):
    lenient = coordl.ImageFolder(store.url, transform="val", size=32, storage_options=store.options(),
                                 on_error="skip", manifest_cache="off")
    gone = lenient.manifest.relpath(5)
    store.delete(gone)
    try:
        loader = coordl.DataLoader(lenient, batch_size=8, num_workers=2)
        counts = epoch_counts(loader)
        assert (counts["errors_skipped"], counts["samples"]) == (1, len(lenient) - 1)
    finally:
        store.restore(gone)


def test_injected_503s_are_retried_by_coordl_counted_and_succeed(store, proxy):
    """3 GETs and 2 listing requests answered 503: each retried once by coordl and counted, none by
    gcsfs or the Azure SDK (their retries would add requests the proxy sees and coordl does not)."""
    with ObjectStore.from_url(store.url, store.options(proxy.url)) as objects:
        proxy.reset_counts()
        proxy.inject(503, 2)
        keys = [o.key for o in objects.list_tree()]
        assert sorted(keys) == store.keys
        assert objects.stats()["retries"] == 2
        proxy.reset_counts()
        proxy.inject(503, 3)
        assert objects.read_many(keys) == [store.local_bytes(k) for k in keys]
        assert proxy.counts["GET"] == len(keys) + 3
        stats = objects.stats()
        assert (stats["gets"], stats["retries"], stats["objects"]) == (len(keys) + 3, 2 + 3, len(keys))


def test_503s_past_the_retries_raise_sample_error(store, proxy):
    with ObjectStore.from_url(store.url, store.options(proxy.url), retries=2) as objects:
        proxy.reset_counts()
        proxy.inject(503, 3)
        key = store.keys[0]
        with pytest.raises(SampleError, match=rf"(?s){store.url}/{key}: GET failed after 3 attempt\(s\).*throttling"):
            objects.read(key)
        assert proxy.counts["GET"] == 3 and objects.stats()["retries"] == 2


@pytest.mark.slow  # waits out 2 x 2 timeouts of 1 s (adlfs: 2 per listing attempt, see _one_attempt)
def test_a_store_that_stops_answering_times_out(store, proxy):
    with ObjectStore.from_url(store.url, store.options(proxy.url), timeout=1.0, retries=1) as objects:
        proxy.reset_counts()
        proxy.hang = True
        with pytest.raises(SampleError, match=rf"{store.url}/.*: GET failed after 2 attempt\(s\).*unreachable"):
            objects.read_many(store.keys[:2])
        with pytest.raises(DatasetError, match=rf"{store.url}/class_\d+: listing failed after 2 attempt\(s\)"):
            objects.list_tree(["class_0000"])
        assert proxy.counts["GET"] >= 4  # 2 GETs and 2 listing requests at least


@pytest.mark.slow
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_server_killed_mid_epoch_is_a_clear_error_within_a_minute(scheme, tiny_root):
    """Its own server, SIGKILLed after the first batch (default timeout and retries): SampleError
    naming an object's URL and the endpoint, well inside 60 s (the autouse no_leaks checks /dev/shm
    and the process tree)."""
    server = _server(scheme)
    proxy = objstore_proxy.FaultProxy(server.url, latency=0.02).start()
    try:
        data = Store(scheme, server, tiny_root)
        ds = coordl.ImageFolder(data.url, transform="val", size=32, storage_options=data.options(proxy.url),
                                manifest_cache="off")
        killed_mid_epoch_fails_within_a_minute(ds, server, data.url)
    finally:
        proxy.stop()
        server.stop()
