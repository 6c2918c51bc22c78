"""cache/storage/policy.py: configuration, back-off, the retry loop, error classes, the store's
redactor, walk order. Pure."""

from __future__ import annotations

import errno
import random

import pytest

from coordl.cache.storage.policy import Retries, StoreConfig, backoff, classify, redactor, walk_order_key
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
    redact = redactor({"key": "AKIAXYZ", "secret": "s3cr3t", "endpoint_url": "http://h:1",
                        "client_kwargs": {"aws_session_token": "tok-123"}})
    text = redact("AKIAXYZ s3cr3t tok-123 envsecret http://h:1 ftp://user:pw@host/x")
    assert text == "*** *** *** *** http://h:1 ftp://***@host/x"
    assert "s3cr3t" not in repr(redact)


def test_redactor_hides_the_key_of_an_azure_connection_string_alone(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=b;AccountKey=envKEY==;EndpointSuffix=x")
    conn = ("DefaultEndpointsProtocol=http;AccountName=a;AccountKey=Eby8vdM0+/k==;"
            "BlobEndpoint=http://127.0.0.1:10000/a;SharedAccessSignature=sv=2020&sig=abc%3D")
    redact = redactor({"connection_string": conn})
    assert redact(f"{conn} | key Eby8vdM0+/k== | sas sv=2020&sig=abc%3D | envKEY== | AccountName=a") == \
        "*** | key *** | sas *** | *** | AccountName=a"


def _run(retries: Retries, outcomes: list) -> tuple[object, list[float]]:
    """The loop every request of the store runs (async or blocking), over scripted `outcomes`:
    (the result or the last error, the waits between attempts)."""
    waits = []
    for outcome in outcomes:
        retries.next_attempt()
        if not isinstance(outcome, BaseException):
            return outcome, waits
        pause = retries.after(outcome)
        if pause is None:
            return outcome, waits
        waits.append(pause)
    raise AssertionError("the script ran out of outcomes")


def test_retries_retry_a_retryable_error_up_to_the_limit_with_backoff():
    config = StoreConfig(retries=3, backoff_base=0.2, backoff_max=1.0)
    retries = Retries(config, random.Random(1))
    result, waits = _run(retries, [TimeoutError()] * 10)
    assert isinstance(result, TimeoutError) and retries.attempts == 4 and len(waits) == 3
    expected = random.Random(1)
    assert waits == [backoff(config, n, expected) for n in range(3)]  # retry n waits backoff(n)


def test_retries_stop_at_a_final_error_and_at_success():
    retries = Retries(StoreConfig(retries=3), random.Random(0))
    result, waits = _run(retries, [TimeoutError(), FileNotFoundError("NoSuchKey"), b"never"])
    assert isinstance(result, FileNotFoundError) and retries.attempts == 2 and len(waits) == 1
    retries = Retries(StoreConfig(retries=3), random.Random(0))
    result, waits = _run(retries, [ConnectionResetError(), b"bytes"])
    assert result == b"bytes" and retries.attempts == 2 and len(waits) == 1


def test_retries_count_again_after_progress():
    """A listing that received a page retries the next page from the full number of retries."""
    retries = Retries(StoreConfig(retries=1), random.Random(0))
    retries.next_attempt()
    assert retries.after(TimeoutError()) is not None   # retry 1 of 1
    retries.next_attempt()
    assert retries.after(TimeoutError()) is None       # none left ...
    retries.progress()                                 # ... until a page arrives
    retries.next_attempt()
    assert retries.after(TimeoutError()) is not None and retries.attempts == 3


def test_retries_with_no_retries_make_one_attempt():
    retries = Retries(StoreConfig(retries=0), random.Random(0))
    result, waits = _run(retries, [TimeoutError(), b"x"])
    assert isinstance(result, TimeoutError) and retries.attempts == 1 and waits == []


def test_walk_order_lists_a_folders_files_before_its_sub_folders():
    keys = ["c/b/x.jpg", "c/z.jpg", "c/a.jpg", "c/a/y.jpg", "b/q.jpg"]
    assert sorted(keys, key=walk_order_key) == ["b/q.jpg", "c/a.jpg", "c/z.jpg", "c/a/y.jpg", "c/b/x.jpg"]
