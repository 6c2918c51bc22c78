"""coordl.ImageFolder over gs:// (gcsfs against gcp-storage-emulator) and az:// (adlfs against Azurite),
each a real server of this module (tests/objservers.py): the listing equals a local copy's and keeps no
secret, the manifest is reused when the store is unchanged, batches (2 workers, 2 epochs, a seeded train
transform) are byte for byte the local ones with storage_reads equal to the GETs the server saw (a
counting proxy in front), and a missing bucket / container is a DatasetError naming the URL at
construction. The s3:// equivalents are in test_imagefolder_s3.py. Counts, not clocks."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

import coordl
from coordl.errors import DatasetError
from coordl.manifest import objects

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coordl_tests_loaderhelp import batches_of  # noqa: E402
from objstore_common import BUCKET, PREFIX, TESTS, _load, local_walk, objstore_proxy  # noqa: E402
from test_imagefolder_s3 import _same  # noqa: E402

objservers = _load("coordl_tests_objservers", os.path.join(TESTS, "objservers.py"))
SCHEMES = {"gs": ("gcsfs", objservers.GcsEmulator), "az": ("adlfs", objservers.Azurite)}


@dataclasses.dataclass
class Store:
    scheme: str
    server: object        # objservers.GcsEmulator | objservers.Azurite
    root: str             # the same files on local disk
    url: str              # gs://data/train, az://data/train

    def options(self, endpoint_url: str | None = None) -> dict:
        return self.server.options(endpoint_url)


@pytest.fixture(scope="module", params=sorted(SCHEMES))
def store(request, tiny_root):
    scheme = request.param
    package, server_cls = SCHEMES[scheme]
    pytest.importorskip(package)
    if scheme == "az" and objservers.azurite_command() is None:
        pytest.skip(objservers.AZURITE_MISSING)
    server = server_cls().start()
    try:
        objservers.upload_folder(server, BUCKET, tiny_root, PREFIX)
        yield Store(scheme, server, tiny_root, f"{scheme}://{BUCKET}/{PREFIX}")
    finally:
        server.stop()


@pytest.fixture
def proxy(store):
    """A counting proxy in front of the module's server."""
    p = objstore_proxy.FaultProxy(store.server.url, latency=0.0).start()
    yield p
    p.stop()


def _secrets(store: Store) -> list[str]:
    return [objservers.AZURE_KEY, store.server.connection_string()] if store.scheme == "az" else []


def test_listing_matches_a_local_copy_reused_and_keeps_no_secret(store, tmp_path):
    opts, cache = store.options(), str(tmp_path)
    ds = coordl.ImageFolder(store.url, storage_options=opts, manifest_cache=cache)
    local = coordl.ImageFolder(store.root, manifest_cache="off")
    assert (ds.classes, ds.class_to_idx, ds.targets, len(ds)) == (local.classes, local.class_to_idx,
                                                                 local.targets, len(local))
    m = ds.manifest
    assert [(m.relpath(i), int(m.sizes[i])) for i in range(len(m))] == local_walk(store.root)
    assert ds.samples == [(f"{store.url}/{rel}", t) for (rel, _), t in zip(local_walk(store.root), local.targets)]
    assert ds.objects.store.fetch_client == "fsspec"
    before = dict(objects.LISTS)
    again = coordl.ImageFolder(store.url, storage_options=opts, manifest_cache=cache)
    assert objects.LISTS["reused"] == before["reused"] + 1 and again.fingerprint == ds.fingerprint
    shown = repr(ds) + repr(ds.objects) + str(ds.samples)
    saved = b"".join(open(os.path.join(cache, f), "rb").read() for f in os.listdir(cache))
    assert store.url.encode() in saved
    for secret in _secrets(store):
        assert secret not in shown and secret.encode() not in saved


def test_batches_are_byte_identical_and_storage_reads_are_the_gets(store, proxy):
    ds = coordl.ImageFolder(store.url, transform="train", size=32, seed=3,
                            storage_options=store.options(endpoint_url=proxy.url))
    local = coordl.ImageFolder(store.root, transform="train", size=32, seed=3)
    remote_loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
    local_loader = coordl.DataLoader(local, batch_size=8, shuffle=True, num_workers=2)
    proxy.reset_counts()
    for _ in range(2):
        assert _same(batches_of(remote_loader), batches_of(local_loader))
    stats = remote_loader.stats()
    assert stats["storage_reads"] == 2 * len(ds) == proxy.counts["GET"]
    assert stats["storage_bytes"] == 2 * ds.manifest.total_bytes


def test_missing_bucket_is_named_at_construction_without_secrets(store):
    url = f"{store.scheme}://nope/{PREFIX}"
    with pytest.raises(DatasetError, match=rf"{url}: bucket 'nope' does not exist") as caught:
        coordl.ImageFolder(url, storage_options=store.options())
    for secret in _secrets(store):
        assert secret not in str(caught.value)


def test_the_s3_client_variable_leaves_other_protocols_alone(store, monkeypatch):
    """COORDL_S3_CLIENT=obstore (set for the s3:// jobs of a machine) names the client of s3:// URLs
    only: a gs:// or az:// dataset lists and reads through fsspec; fetch_client='obstore' passed for
    such a URL is still a ConfigError."""
    from coordl.errors import ConfigError

    monkeypatch.setenv("COORDL_S3_CLIENT", "obstore")
    ds = coordl.ImageFolder(store.url, storage_options=store.options(), manifest_cache="off")
    assert ds.objects.store.fetch_client == "fsspec" and len(ds) == len(local_walk(store.root))
    assert bytes(ds.fetch(0)) == open(os.path.join(store.root, ds.manifest.relpath(0)), "rb").read()
    with pytest.raises(ConfigError, match="obstore reads only s3://"):
        coordl.ImageFolder(store.url, storage_options=store.options(), manifest_cache="off", fetch_client="obstore")
