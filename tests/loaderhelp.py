"""Loader helpers the tests share: an epoch's batches, its counters, the change of the counters.

Importable as `coordl_tests_loaderhelp` (registered in tests/conftest.py, as tests/forked.py and
tests/jobs.py are: tests/ is no package).

    batches_of(loader)             # [(images, labels), ...] of one epoch, cloned
    epoch_counts(loader)           # {counter: change} of one epoch (loader.stats() before and after)
    epoch_batches_counts(loader)   # (batches_of, epoch_counts) of one epoch
    counts_of(loader, run)         # {counter: change} while run() runs
    counts_delta(before, after)    # after - before, per counter (of `keys` when given)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def batches_of(loader: Any) -> list:
    """Every (images, labels) batch of one epoch, cloned (a batch buffer may be reused)."""
    return [(x.clone(), y.clone()) for x, y in loader]


def counts_delta(before: dict, after: dict, keys: Iterable[str] | None = None) -> dict[str, int]:
    """after - before, for each of `keys` (default: every counter of `after`; 0 where `before` has none)."""
    return {k: after[k] - before.get(k, 0) for k in (after if keys is None else keys)}


def counts_of(loader: Any, run: Callable[[], Any]) -> dict[str, int]:
    """How `loader.stats()` changed while `run()` ran."""
    before = loader.stats()
    run()
    return counts_delta(before, loader.stats())


def epoch_counts(loader: Any) -> dict[str, int]:
    """How `loader.stats()` changed over one epoch (its batches dropped)."""
    before = loader.stats()
    for _ in loader:
        pass
    return counts_delta(before, loader.stats())


def epoch_batches_counts(loader: Any) -> tuple[list, dict[str, int]]:
    """(the batches of one epoch, cloned; how `loader.stats()` changed over it)."""
    before = loader.stats()
    out = batches_of(loader)
    return out, counts_delta(before, loader.stats())
