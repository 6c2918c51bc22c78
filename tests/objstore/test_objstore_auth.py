"""Credentials with cache/storage/objstore.py, on a moto server of this module with authentication on:
the right ones read; a wrong secret or an unknown key is a ConfigError at construction naming the
URL and the fix; no secret ever appears in a message, a chained exception, a traceback or a repr."""

from __future__ import annotations

import os
import sys
import traceback

import pytest

from coordl.cache.storage.objstore import ObjectStore
from coordl.errors import ConfigError, SampleError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objstore_common import make_s3_dataset, s3server  # noqa: E402


@pytest.fixture(scope="module")
def auth(moto_server, tiny_root, tmp_path_factory):
    data = make_s3_dataset(moto_server, tiny_root, tmp_path_factory)
    key, secret = s3server.enable_auth(moto_server)
    return data, key, secret


def _everything_shown(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def test_right_credentials_read(auth):
    data, key, secret = auth
    with ObjectStore.from_url(data.url, data.options(key=key, secret=secret)) as store:
        assert store.read(data.keys[0]) == data.local_bytes(data.keys[0])
        assert key not in repr(store) and secret not in repr(store)


@pytest.mark.parametrize("which", ["wrong secret", "unknown key"])
def test_bad_credentials_fail_at_construction_without_showing_them(auth, which):
    data, key, secret = auth
    bad_key, bad_secret = (key, "WRONG-secret-1234") if which == "wrong secret" else ("AKIAUNKNOWN0000", secret)
    with pytest.raises(ConfigError) as info:
        ObjectStore.from_url(data.url, data.options(key=bad_key, secret=bad_secret))
    err = info.value
    assert str(err).startswith("s3://data/train: access denied") and "AWS_SECRET_ACCESS_KEY" in str(err)
    assert err.__cause__ is None and err.__context__ is None
    shown = _everything_shown(err)
    for secret_text in (bad_key, bad_secret, key, secret):
        assert secret_text not in shown


def test_bad_credentials_from_the_environment_are_not_shown(auth, monkeypatch):
    data, key, _ = auth
    monkeypatch.setenv("AWS_ENDPOINT_URL", data.server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-WRONG-secret-5678")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(ConfigError) as info:
        ObjectStore.from_url(data.url)
    shown = _everything_shown(info.value)
    assert "env-WRONG-secret-5678" not in shown and key not in shown


def test_sample_errors_do_not_show_secrets(auth):
    data, key, secret = auth
    with ObjectStore.from_url(data.url, data.options(key=key, secret=secret)) as store:
        with pytest.raises(SampleError) as info:
            store.read("class_0000/missing.jpg")
        shown = _everything_shown(info.value)
        assert "s3://data/train/class_0000/missing.jpg" in shown
        assert key not in shown and secret not in shown


def test_image_folder_with_a_wrong_secret_fails_at_construction_naming_the_url(auth):
    import coordl

    data, key, secret = auth
    bad = "WRONG-secret-" + "9876"  # a variable: the traceback shows this test's source lines
    with pytest.raises(ConfigError) as info:
        coordl.ImageFolder(data.url, storage_options=data.options(key=key, secret=bad))
    assert str(info.value).startswith("s3://data/train: access denied")
    shown = _everything_shown(info.value)
    assert "WRONG-secret-9876" not in shown and key not in shown and secret not in shown


def test_image_folder_reads_the_aws_environment_variables(auth, monkeypatch, tmp_path):
    import coordl

    data, key, secret = auth
    monkeypatch.setenv("AWS_ENDPOINT_URL", data.server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ds = coordl.ImageFolder(data.url, transform=None, manifest_cache=str(tmp_path))
    assert len(ds) == len(data.keys) and ds.fetch(0) == data.local_bytes(ds.manifest.relpath(0))
    saved = b"".join(open(os.path.join(tmp_path, f), "rb").read() for f in os.listdir(tmp_path))
    assert secret.encode() not in saved and key.encode() not in saved and secret not in repr(ds)
