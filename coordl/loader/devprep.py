"""``coordl.DataLoader(dataset, ..., device="cuda")``: workers send bytes, the training process prepares.

    workers: fetch (every storage and cache path) -> batchprep.plan_item (header, box, flip) -> EncodedBatch
    here:    BatchPrep.run: one batched decode (nvImageCodec / nvJPEG / CPU), CPU fallbacks, crop+resize+flip
             into a pool buffer (coordl/loader/devpool.py) -> Batch([images (B, 3, H, W) on `device`, labels])

``device="cpu"`` runs the very same path on CPU tensors (tests, machines without a GPU). Counters:
``gpu_decodes`` (images the batch decoder decoded), ``gpu_cpu_fallbacks`` (images it refused or
does not take, decoded on the CPU), ``gpu_prep_us`` (microseconds the training process spent
preparing), ``gpu_buffer_misses`` (batches that found every pool buffer in use: a fresh tensor).
A file that fails to decode here is a `SampleError` naming it, or with on_error="skip" dropped
and counted (its worker had counted it as a sample: taken back).

NOTE (overlap): one batch ahead. When batch k is handed out, batch k+1's prep has been launched:
on CUDA on this epoch's side stream, which first waits for the user's current stream (so a pool
buffer the user dropped is rewritten only after the steps queued on it), and the user's stream
waits on an event recorded after batch k's prep before batch k is returned (`record_stream` tells
torch's allocator the user's stream uses it). On the CPU the same code runs synchronously. The
batch prepared ahead is not counted as received (`state_dict`) until it is handed out, and an
error pulling it (a worker's, the end of the epoch) is raised when its turn comes.
``device_buffers=0`` turns both off: each batch is a new tensor, prepared when asked for.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from coordl.batch import Batch, EncodedBatch
from coordl.datasets.onerror import skip_or_raise
from coordl.errors import SampleError
from coordl.loader.devpool import DevicePool
from coordl.loader.iterators import Position
from coordl.pipelines import batchdecode, batchprep


@dataclass
class _Pending:
    """A batch pulled from the loader and launched: what `DeviceEpoch._finish` hands out or raises."""

    encoded: Any                               # the EncodedBatch (or what the loader yielded as is)
    got: batchprep.Prepared | None = None      # its prep, launched (None: not an EncodedBatch)
    error: BaseException | None = None         # raised at its turn: StopIteration, a worker's error
    ready: Any = None                          # CUDA: an Event recorded on the side stream after its prep
    prep_us: int = 0


class DeviceEpoch(Iterator):
    """One epoch: the loader's own iterator of `EncodedBatch` es, prepared on `device` one ahead."""

    def __init__(self, inner: Any, dataset: Any, prep: batchprep.BatchPrep, pool: DevicePool,
                 position: Position) -> None:
        self._inner, self._ds, self._prep, self._pool, self._pos = inner, dataset, prep, pool, position
        self._side = torch.cuda.Stream(prep.device) if prep.device.type == "cuda" else None
        self._ahead: _Pending | None = None

    def __len__(self) -> int:
        return len(self._inner)

    def __next__(self) -> Batch:
        current = self._ahead if self._ahead is not None else self._launch()
        self._ahead = self._launch() if self._pool.slots and current.error is None else None
        return self._finish(current)

    def _launch(self) -> _Pending:
        try:
            encoded = next(self._inner)
        except Exception as e:  # noqa: BLE001 (StopIteration, a worker's error: raised at this batch's turn)
            return _Pending(None, error=e)
        self._pos.received -= 1  # counted as received when handed out (_finish)
        if not isinstance(encoded, EncodedBatch):
            return _Pending(encoded)
        started = time.perf_counter()
        try:
            with self._on_side_stream():
                out, missed = self._pool.take(len(encoded.raws), self._prep.size)
                got = self._prep.run(encoded.raws, encoded.plans, out)
                ready = self._side.record_event() if self._side is not None else None
        except Exception as e:  # noqa: BLE001 (raised at this batch's turn, not while batch k is handed out)
            return _Pending(encoded, error=e)
        self._ds.counters.add(gpu_buffer_misses=int(missed))
        return _Pending(encoded, got, None, ready, int((time.perf_counter() - started) * 1e6))

    def _on_side_stream(self) -> contextlib.AbstractContextManager:
        if self._side is None:
            return contextlib.nullcontext()
        self._side.wait_stream(torch.cuda.current_stream(self._prep.device))
        return torch.cuda.stream(self._side)

    def _finish(self, pending: _Pending) -> Batch:
        if pending.encoded is not None:  # pulled from the loader (its prep may have failed)
            self._pos.received += 1
        if pending.error is not None:
            raise pending.error
        encoded: Any = pending.encoded
        got, ds = pending.got, self._ds
        if got is None:
            return encoded
        for pos in sorted(got.errors):
            err = ds._sample_error(encoded.items[pos], SampleError(str(got.errors[pos])))
            ds.counters.add(samples=-1)
            skip_or_raise(ds.on_error, ds.counters, err)
        images = got.images if got.images is not None else torch.empty(
            (0, 3, *self._prep.size), dtype=self._prep.dtype, device=self._prep.device)
        if pending.ready is not None:
            stream = torch.cuda.current_stream(self._prep.device)
            stream.wait_event(pending.ready)
            images.record_stream(stream)
        labels = encoded.labels[got.kept] if isinstance(encoded.labels, torch.Tensor) else \
            [encoded.labels[k] for k in got.kept]
        ds.counters.add(gpu_decodes=got.device_decodes, gpu_cpu_fallbacks=got.fallbacks, gpu_prep_us=pending.prep_us)
        return Batch([images, labels])


def device_epoch(inner: Any, dataset: Any, decoder: str, pool: DevicePool, position: Position) -> DeviceEpoch:
    prep = batchprep.BatchPrep(batchdecode.open_decoder(decoder, pool.device), dataset.size, pool.dtype)
    return DeviceEpoch(inner, dataset, prep, pool, position)
