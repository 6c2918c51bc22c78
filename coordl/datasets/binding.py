"""`Binding`: what a loader attaches to the copy of a coordl dataset it works on.

    bound = dataset.bind(Binding(counters=Counters(num_workers), cache=cache))

`CoordlDataset.bind` returns a light copy of the dataset (the manifest arrays
shared, read-only) that carries one `Binding`; the dataset the user passed has
none and never changes. The dataset reads its counters, cache and buffers from
the binding; the loader (coordl/loader/dataloader.py) and the coordinator
(coordl/coordinator/daemon.py, client.py) own and set them. Torch copies the
bound dataset into each worker process (by fork, or by pickling), binding
included: `buffers` is then each worker's own, made at its first batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Counting(Protocol):
    """What a dataset counts into: `coordl.loader.stats.Counters` (a loader's), the coordinator's
    `TaskCounters` (per prep task), or nothing (an unbound dataset)."""

    def add(self, **amounts: int) -> None: ...


class NoCounters:
    """Counts nothing: a dataset used outside a coordl.DataLoader has no shared counter block."""

    def add(self, **amounts: int) -> None:
        pass


NO_COUNTERS = NoCounters()


@dataclass
class Binding:
    counters: Counting                 # what the bound dataset counts into (stats.KEYS)
    cache: Any = None                  # a MinIO or partitioned cache to read through (None: storage)
    drop_page_cache: bool = False      # read storage without leaving its pages in the page cache
    batch_slots: int = 0               # reusable batch buffers a worker may keep (coordl/buffers.py;
    #                                    set by the loader, 0: a fresh buffer per batch)
    buffers: Any = None                # ... and, in a worker process, those buffers (WorkerBuffers)
    encoded: bool = False              # DataLoader(device=...): batches of bytes + plans, no pixels
    #                                    (coordl/loader/devprep.py)
    coordinator: Any = None            # a coordinated loader's daemon client (coordinator/client.py),
    #                                    for a framework that re-creates the loader from its dataset
