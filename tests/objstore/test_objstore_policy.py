"""cache/storage/policy.py: configuration, back-off, error classes, redaction, walk order. Pure."""

from __future__ import annotations

import errno
import random

import pytest

from coordl.cache.storage.policy import Redactor, StoreConfig, backoff, classify, walk_order_key
from coordl.errors import ConfigError


def test_defaults_fail_a_dead_store_within_a_minute():
    assert StoreConfig().worst_case_seconds() < 60


@pytest.mark.parametrize("field,value", [("max_in_flight", 0), ("max_in_flight", True), ("timeout", -1.0),
                                         ("retries", 21), ("backoff_base", -0.1), ("backoff_max", 0.0)])
def test_bad_config_names_the_parameter(field, value):
    with pytest.raises(ConfigError, match=rf"ObjectStore {field}={value!r} is not valid: pass"):
        StoreConfig(**{field: value})


def test_backoff_is_jittered_exponential_and_capped():
    config, rng = StoreConfig(backoff_base=0.2, backoff_max=1.0), random.Random(0)
    for retry in range(8):
        waits = [backoff(config, retry, rng) for _ in range(200)]
        cap = min(1.0, 0.2 * 2 ** retry)
        assert all(0 <= w <= cap for w in waits) and max(waits) > cap / 2


class EndpointConnectionError(Exception):  # named like botocore's
    pass


@pytest.mark.parametrize("exc,kind", [
    (FileNotFoundError("NoSuchKey"), "missing"),
    (PermissionError("SignatureDoesNotMatch"), "denied"),
    (OSError(errno.EBUSY, "Please reduce your request rate."), "retry"),
    (OSError(errno.EIO, "An error occurred (InternalError)"), "retry"),
    (TimeoutError(), "retry"),
    (ConnectionRefusedError(), "retry"),
    (EndpointConnectionError("Could not connect"), "retry"),
    (ValueError("bad range"), "fatal"),
])
def test_classify(exc, kind):
    assert classify(exc) == kind


def test_redactor_removes_option_env_and_url_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    redact = Redactor({"key": "AKIAXYZ", "secret": "s3cr3t", "endpoint_url": "http://h:1",
                       "client_kwargs": {"aws_session_token": "tok-123"}})
    text = redact("AKIAXYZ s3cr3t tok-123 envsecret http://h:1 ftp://user:pw@host/x")
    assert text == "*** *** *** *** http://h:1 ftp://***@host/x"
    assert "s3cr3t" not in repr(redact)


def test_redactor_hides_the_key_of_an_azure_connection_string_alone(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=b;AccountKey=envKEY==;EndpointSuffix=x")
    conn = ("DefaultEndpointsProtocol=http;AccountName=a;AccountKey=Eby8vdM0+/k==;"
            "BlobEndpoint=http://127.0.0.1:10000/a;SharedAccessSignature=sv=2020&sig=abc%3D")
    redact = Redactor({"connection_string": conn})
    assert redact(f"{conn} | key Eby8vdM0+/k== | sas sv=2020&sig=abc%3D | envKEY== | AccountName=a") == \
        "*** | key *** | sas *** | *** | AccountName=a"


def test_walk_order_lists_a_folders_files_before_its_sub_folders():
    keys = ["c/b/x.jpg", "c/z.jpg", "c/a.jpg", "c/a/y.jpg", "b/q.jpg"]
    assert sorted(keys, key=walk_order_key) == ["b/q.jpg", "c/a.jpg", "c/z.jpg", "c/a/y.jpg", "c/b/x.jpg"]
