"""coordl/datasets/onerror.py: the one skip-or-raise rule and its message, used by every backend."""

from __future__ import annotations

import collections
import pathlib

import pytest

from coordl.datasets.onerror import READABLE, sample_error, skip_or_raise
from coordl.errors import DecodeError, SampleError


class _Counts:
    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def add(self, **amounts: int) -> None:
        self.counts.update(amounts)


def test_the_message_names_the_file_the_error_and_the_fix():
    err = sample_error("/data/cat/1.jpg", DecodeError("not an image (starts with b'GIF8')"))
    assert isinstance(err, SampleError)
    assert str(err) == ("/data/cat/1.jpg: not an image (starts with b'GIF8'): replace or remove the file, "
                        "or pass on_error='skip'")
    read = sample_error("/data/cat/2.jpg", "cannot read the file (Permission denied)", READABLE)
    assert str(read) == ("/data/cat/2.jpg: cannot read the file (Permission denied): check that it exists "
                         "and is readable, or pass on_error='skip'")


def test_an_error_that_names_the_file_is_kept_as_it_is():
    named = SampleError("/data/cat/1.jpg: truncated: replace or remove the file, or pass on_error='skip'")
    assert sample_error("/data/cat/1.jpg", named) is named
    assert str(sample_error("/data/cat/1.jpg", ValueError(str(named)))) == str(named)


def test_raise_raises_the_error_and_counts_nothing():
    counts, err = _Counts(), SampleError("/x.jpg: bad")
    with pytest.raises(SampleError) as info:
        skip_or_raise("raise", counts, err)
    assert info.value is err and not counts.counts


def test_skip_counts_one_and_raises_nothing():
    counts = _Counts()
    for _ in range(3):
        skip_or_raise("skip", counts, SampleError("/x.jpg: bad"))
    assert counts.counts == {"errors_skipped": 3}


def test_raised_inside_a_handler_it_does_not_chain_to_it():
    counts = _Counts()
    with pytest.raises(SampleError) as info:
        try:
            raise OSError("disk")
        except OSError:
            skip_or_raise("raise", counts, sample_error("/x.jpg", "cannot read the file (disk)", READABLE))
    assert info.value.__suppress_context__ and info.value.__cause__ is None


def test_the_backends_use_it_and_write_no_message_of_their_own():
    root = pathlib.Path(__file__).resolve().parents[2]
    users = ["coordl/datasets/imagefolder.py", "coordl/datasets/daliflow.py", "coordl/loader/dali.py",
             "coordl/coordinator/workers.py"]
    texts = {f: (root / f).read_text() for f in users}
    assert [f for f, t in texts.items() if "replace or remove the file" in t] == []
    assert [f for f, t in texts.items() if "errors_skipped=1" in t] == []
    assert "daliflow" in texts["coordl/loader/dali.py"] and "daliflow" in texts["coordl/coordinator/workers.py"]
