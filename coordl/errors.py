"""The exception tree. Every error coordl raises derives from `CoordlError`.

Each class takes a single message string, so that torch's DataLoader can
re-raise it in the main process with the worker's traceback attached
(`torch.utils.data._utils.ExceptionWrapper` rebuilds `exc_type(msg)`).
Messages name the thing (file, parameter, server), the value, and the fix.
"""

from __future__ import annotations

from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)


class CoordlError(Exception):
    """Root of every error raised by coordl."""


class ConfigError(CoordlError, ValueError):
    """A parameter has a value coordl cannot use; the message names it and the fix."""


class DatasetError(CoordlError):
    """The dataset on disk is unusable: missing root, empty class folder, no images."""


class SampleError(CoordlError):
    """One item could not be read or decoded; the message names its file."""


class DecodeError(SampleError):
    """The bytes are not an image coordl can decode: not an image, truncated, corrupt, or too large.

    Raised by coordl.pipelines without a file name (pipelines know pixels, not
    paths); coordl.datasets.imagefolder re-raises it as a SampleError naming the file.
    """


class CacheError(CoordlError):
    """The shared-memory cache cannot be created, attached or written."""


class CoordinatorError(CoordlError):
    """The coordinator daemon refused a job, detached it, or went away."""


def at_item(err: _E, item: int) -> _E:
    """Note on `err` the dataset item it happened at, and return it: a coordinator prep worker's
    failure report then names the item and its file (coordl/coordinator/protocol.py `Failure`).
    An attribute of the exception's own, so any exception can carry it, as WebDataset's carry
    their url."""
    vars(err)["coordl_item"] = int(item)
    return err


def item_of(err: BaseException) -> int | None:
    """The item `at_item` noted on `err`, else None."""
    return vars(err).get("coordl_item")
