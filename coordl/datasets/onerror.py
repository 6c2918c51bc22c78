"""``on_error="raise" | "skip"``: the one rule for a bad item, and the one message that names it.

    try:
        raw = ds.fetch(i)
    except SampleError as e:
        skip_or_raise(ds.on_error, ds.counters, sample_error(ds.manifest.path(i), e))

Used by `coordl.ImageFolder` (the CPU loop), the DALI flow (coordl/datasets/daliflow.py: the
DALI loader and the daemon's DALI workers) and so by every backend alike: a bad file raises
`SampleError` naming the file, what is wrong and the fix, or is counted in ``errors_skipped``.
"""

from __future__ import annotations

from typing import Any

from coordl.errors import SampleError

#: the fix for a file that cannot be decoded
REPLACE = "replace or remove the file"
#: the fix for a file that cannot be read
READABLE = "check that it exists and is readable"


def sample_error(path: str, err: BaseException | str, fix: str = REPLACE) -> SampleError:
    """`err` as a `SampleError` that names `path`, the error and the fix (`fix`, or on_error='skip').

    An error whose message starts with `path` names it already and is returned as it is
    (a `SampleError`), so a message is never prefixed twice.
    """
    text = str(err)
    if text.startswith(path):
        return err if isinstance(err, SampleError) else SampleError(text)
    return SampleError(f"{path}: {text}: {fix}, or pass on_error='skip'")


def skip_or_raise(on_error: str, counters: Any, err: SampleError) -> None:
    """Raise `err` (on_error="raise"), or count one ``errors_skipped`` into `counters` (on_error="skip")."""
    if on_error != "skip":
        raise err from err.__cause__  # its own cause, not the exception being handled when it was made
    counters.add(errors_skipped=1)
