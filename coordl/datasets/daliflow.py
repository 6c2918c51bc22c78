"""The one DALI flow of a coordl dataset: fetch -> (DALI decodes) -> settle -> labels.

    raws, items = fetch(ds, indices)             # bytes via ds.fetch (cache, then storage; counted)
    prep.submit(raws, items, epoch)              # pipelines/dali.Prep: decode + crop + resize + flip
    kept = settle(ds, items, result.kept, result.errors)   # bad items raised or skipped; samples counted
    labels_of(ds, kept)                          # int64 labels of the kept items, in order

Both DALI consumers run it: the DALI loader (coordl/loader/dali.py, batches in flight) and
the daemon's DALI prep workers (coordl/coordinator/workers.py `DaliRows`, rows straight into
the ring). Counters as the CPU backend's: every item handed to the decoder counts one
``decodes``, every one kept one ``samples``; a bad item follows ``ds.on_error``
(coordl/datasets/onerror.py: `SampleError` naming the file, or one ``errors_skipped``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from coordl.errors import SampleError, at_item

from . import admission
from .onerror import sample_error, skip_or_raise


def fetch(ds: Any, indices: Iterable[int]) -> tuple[list, list[int]]:
    """The encoded bytes of `indices` (``ds.fetch``) and the items they belong to; an item whose
    bytes cannot be read is raised or skipped by ``ds.on_error``. Counts the items as ``decodes``.
    Bytes read from storage wait for `settle` to enter the cache (admission.defer): a file DALI
    cannot decode never takes cache space."""
    raws, items = [], []
    with admission.admitting(ds):
        for i in indices:
            i = int(i)
            try:
                raws.append(ds.fetch(i))
            except SampleError as e:
                skip_or_raise(ds.on_error, ds.counters, at_item(sample_error(ds.manifest.path(i), e), i))
                continue
            items.append(i)
        admission.defer(ds)
    ds.counters.add(decodes=len(items))
    return raws, items


def settle(ds: Any, items: list[int], kept: Iterable[int], errors: Mapping[int, Exception]) -> list[int]:
    """After DALI: each error (by position in `items`) raised naming its file, or skipped, in
    order; the kept items (positions `kept`), counted as ``samples``."""
    out = [items[pos] for pos in kept]
    admission.admit_deferred(ds, out, [items[pos] for pos in errors])
    for pos in sorted(errors):
        skip_or_raise(ds.on_error, ds.counters, at_item(sample_error(ds.manifest.path(items[pos]), errors[pos]),
                                                        items[pos]))
    ds.counters.add(samples=len(out))
    return out


def labels_of(ds: Any, kept: list[int]) -> np.ndarray:
    """The int64 labels of the `kept` items, in order (before any target_transform)."""
    return ds.manifest.labels[kept].astype(np.int64, copy=False)
