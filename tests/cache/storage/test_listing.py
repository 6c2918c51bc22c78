"""listing.in_forked_child: a listing done in a forked child comes back as plain data
(msgpack over a pipe, never a pickle); its errors come back as coordl's classes; a child that dies
is an error naming the work; no child is left."""

from __future__ import annotations

import os

import pytest

from coordl.cache.storage.listing import in_forked_child
from coordl.errors import ConfigError, DatasetError


def test_the_result_comes_back_as_plain_data():
    got = in_forked_child(lambda: ([["train/a/1.jpg", 12, "e1"], ["train/b/2.jpg", 7, None]], {"lists": 3}), "w")
    assert got == [[["train/a/1.jpg", 12, "e1"], ["train/b/2.jpg", 7, None]], {"lists": 3}]


def test_a_coordl_error_is_raised_again_as_its_class():
    def work():
        raise ConfigError("s3://b/train: access denied: check the credentials")

    with pytest.raises(ConfigError, match=r"^s3://b/train: access denied: check the credentials$"):
        in_forked_child(work, "s3://b/train: listing")


def test_another_error_is_a_dataset_error_naming_the_work():
    def work():
        raise KeyError("NextContinuationToken")

    with pytest.raises(DatasetError, match=r"s3://b/train: listing: KeyError: 'NextContinuationToken'"):
        in_forked_child(work, "s3://b/train: listing")


def test_a_result_msgpack_cannot_carry_is_named_not_unpickled():
    with pytest.raises(DatasetError, match=r"TypeError: the listing's result could not be sent"):
        in_forked_child(lambda: object(), "w")


def test_a_child_that_dies_is_an_error_naming_the_work():
    with pytest.raises(DatasetError, match=r"s3://b/train: listing: the listing process \d+ ended without an answer"):
        in_forked_child(lambda: os._exit(3), "s3://b/train: listing")
