"""``coordl.DataLoader(dataset, ..., device="cuda")``: workers send bytes, the training process prepares.

    workers: fetch (every storage and cache path) -> batchprep.plan_item (header, box, flip) -> EncodedBatch
    here:    BatchPrep.run: one batched decode (nvImageCodec / nvJPEG / CPU), CPU fallbacks, crop+resize+flip
             -> Batch([images (B, 3, H, W) on `device`, labels])

``device="cpu"`` runs the very same path on CPU tensors (tests, machines without a GPU). Counters:
``gpu_decodes`` (images the batch decoder decoded), ``gpu_cpu_fallbacks`` (images it refused or
does not take, decoded on the CPU), ``gpu_prep_us`` (microseconds the training process spent
preparing). A file that fails to decode here is a `SampleError` naming it, or with
on_error="skip" dropped and counted (its worker had counted it as a sample: taken back).
NOTE: not yet done: preparing batch k+1 on a side stream while step k trains, and a fixed
pool of device buffers (each batch is a new tensor from torch's caching allocator).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from coordl.batch import Batch, EncodedBatch
from coordl.datasets.onerror import skip_or_raise
from coordl.errors import SampleError
from coordl.pipelines import batchdecode, batchprep


class DeviceEpoch(Iterator):
    """One epoch: the loader's own iterator of `EncodedBatch` es, prepared on `device` as they come."""

    def __init__(self, inner: Any, dataset: Any, prep: batchprep.BatchPrep) -> None:
        self._inner, self._ds, self._prep = inner, dataset, prep

    def __len__(self) -> int:
        return len(self._inner)

    def __next__(self) -> Batch:
        encoded = next(self._inner)
        if not isinstance(encoded, EncodedBatch):
            return encoded
        started = time.perf_counter()
        got = self._prep.run(encoded.raws, encoded.plans)
        ds = self._ds
        for pos in sorted(got.errors):
            err = ds._sample_error(encoded.items[pos], SampleError(str(got.errors[pos])))
            ds.counters.add(samples=-1)
            skip_or_raise(ds.on_error, ds.counters, err)
        images = got.images if got.images is not None else torch.empty(
            (0, 3, *self._prep.size), dtype=self._prep.dtype, device=self._prep.device)
        labels = encoded.labels[got.kept] if isinstance(encoded.labels, torch.Tensor) else \
            [encoded.labels[k] for k in got.kept]
        ds.counters.add(gpu_decodes=got.device_decodes, gpu_cpu_fallbacks=got.fallbacks,
                        gpu_prep_us=int((time.perf_counter() - started) * 1e6))
        return Batch([images, labels])


def device_epoch(inner: Any, dataset: Any, device: str, dtype: torch.dtype, decoder: str) -> DeviceEpoch:
    return DeviceEpoch(inner, dataset, batchprep.BatchPrep(batchdecode.open_decoder(decoder, device),
                                                           dataset.size, dtype))
