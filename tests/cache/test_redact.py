"""cache/redact.py: the one credential redactor, for object-store texts and cache-node URLs. Pure."""

from __future__ import annotations

from coordl.cache.redact import Redactor, redact_url, scrub, url_secrets


def test_secrets_go_longest_first_and_short_ones_stay():
    redact = Redactor(["abc", "abcdef", "xy"])
    assert redact("abcdef abc xy") == "*** *** xy"     # "xy" is under the 3 characters of `shortest`
    assert Redactor(["xy"], shortest=2)("xy") == "***"
    assert "abcdef" not in repr(redact) and repr(redact) == "Redactor(2 secrets)"


def test_object_store_urls_keep_an_at_sign_of_their_key():
    redact = Redactor()
    assert redact("s3://AKIA:secret@bucket/a@b.jpg failed") == "s3://***@bucket/a@b.jpg failed"
    assert redact("s3://bucket/a@b.jpg") == "s3://bucket/a@b.jpg"   # no credentials: the key as it is


def test_node_urls_hide_everything_before_the_last_at_sign():
    url = "redis://:pa/ss@w@host:6390/0"               # a password not percent-encoded
    assert redact_url(url) == "redis://***@host:6390/0"
    assert redact_url("unix:///tmp/redis.sock") == "unix:///tmp/redis.sock"
    assert Redactor(whole_userinfo=True)(f"at {url}: refused") == "at redis://***@host:6390/0: refused"


def test_scrub_hides_a_node_password_raw_encoded_and_decoded():
    url = "redis://user:p%40ss%2Fw@h:6390/0"
    assert {"p%40ss%2Fw", "p@ss/w", "user"} <= set(url_secrets(url))
    text = scrub("AUTH p@ss/w failed; p%40ss%2Fw; user; redis://other:pw@x:1/0", url)
    assert "p@ss" not in text and "p%40ss" not in text and "user" not in text and "pw@" not in text
    assert text.endswith("redis://***@x:1/0")
    assert url_secrets("redis://h:6390/0") == []
