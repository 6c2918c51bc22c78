"""The DALI backend of `coordl.DataLoader(dataset, ..., backend="dali")`: one epoch's batches.

    sampler ────────────────> batches of indices (each with its .epoch; the loader's index sampler)
    dataset.fetch(i) ───────> encoded bytes (MinIO cache, then storage; counted: datasets/daliflow.py)
    pipelines/dali.Prep ────> DALI decode + crop + resize + flip, `depth` batches in flight
                        ───> Batch([images uint8 (B, 3, H, W), labels int64 (B,)])

Same epoch order, labels and augmentation as the CPU backend: the order is
the loader's sampler (seed, epoch -> order), an item's crop and flip are
drawn from `crop.item_rng(seed, epoch, item)` as on the CPU
(pipelines/dali.py), so both backends crop the same boxes and a batch is a
pure function of (seed, epoch, items). Counters as the CPU backend's:
fetch counts storage reads and cache hits, every item handed to the decoder
counts one ``decodes``, every one yielded one ``samples``, every one
dropped by ``on_error="skip"`` one ``errors_skipped``.

Threads: ``num_workers=W`` gives DALI ``num_threads=max(W, 1)`` decode
threads, in the training process (no worker processes, so torch's warning
about too many of them is not given: loader.py); the calling
thread fetches bytes and plans crops while they decode. ``prefetch_factor``
(default 2) is the number of batches in flight. Images are contiguous
(B, 3, H, W) (the CPU backend's are the same shape, in channels_last
memory). ``device="gpu"`` (the loader's ``dali_device`` attribute) decodes
with nvJPEG ("mixed") and resizes on the GPU; images are CUDA tensors on
torch's current device when torch has CUDA, else copied to host memory
(a CPU-only torch wheel on a GPU machine still gets GPU decoding).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from coordl.batch import Batch, collate
from coordl.datasets import daliflow
from coordl.datasets.base import CoordlDataset
from coordl.errors import ConfigError
from coordl.pipelines import dali
from coordl.pipelines.dali import gpu_count  # noqa: F401 (coordl.loader.dali.gpu_count, as before)


def require_dali() -> None:
    """Raise ConfigError with the install hint (``pip install -e '.[dali]'``) if DALI is missing."""
    dali.require()


def dali_threads(num_workers: int) -> int:
    """DALI's ``num_threads`` for a loader's ``num_workers``."""
    return max(int(num_workers), 1)


def _check(loader: Any, ds: Any) -> None:
    if not isinstance(ds, CoordlDataset) or getattr(ds, "manifest", None) is None:
        raise ConfigError(f"backend='dali' needs a coordl dataset over a manifest of files; "
                          f"{type(ds).__name__} is not one: use coordl.ImageFolder")
    transform = getattr(ds, "transform", None)  # (a coordl dataset's; CoordlDataset does not declare it)
    if transform not in dali.TRANSFORMS:
        raise ConfigError(f"backend='dali' runs transform='train' or 'val'; the dataset has "
                          f"transform={transform!r}: use one of them, or the CPU backend")
    if loader.batch_sampler is None:  # torch: no automatic batching
        raise ConfigError("backend='dali' needs batches: pass batch_size (or batch_sampler), not batch_size=None")
    if loader.collate_fn is not collate:
        raise ConfigError(f"backend='dali' builds its batches itself; collate_fn={loader.collate_fn!r} "
                          "would be ignored: leave collate_fn unset, or use the CPU backend")


def _batch_size(loader) -> int:
    size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)
    if not isinstance(size, int):
        raise ConfigError(f"backend='dali' needs the largest batch size up front; batch_sampler="
                          f"{loader.batch_sampler!r} has no int batch_size attribute: give it one")
    return size


def _gpu_export(tensors) -> torch.Tensor:
    from nvidia.dali.plugin.pytorch.torch_utils import feed_ndarray

    dense = tensors.as_tensor()
    out = torch.empty(dense.shape(), dtype=torch.uint8, device=torch.device("cuda", torch.cuda.current_device()))
    feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream())
    return out


class DaliEpoch(Iterator):
    """One epoch of the DALI backend: an iterator with `len` (what ``iter(loader)`` returns).

    ``sampler`` gives the epoch's batches of indices, ``dataset`` is the loader's bound dataset
    (counting into its counters), ``position`` what its state_dict saves (coordl/loader/iterators.py),
    or None; ``loader`` is read for its public torch arguments only (batch_size, batch_sampler,
    num_workers, prefetch_factor, pin_memory, collate_fn).
    """

    def __init__(self, loader, sampler, dataset, position=None, device: str = "cpu") -> None:
        _check(loader, dataset)
        self._loader, self._device = loader, device
        self._ds, self._sampler, self._position = dataset, sampler, position
        self._len = len(sampler)
        self._gen = self._run()

    def __len__(self) -> int:
        return self._len

    def __next__(self):
        try:
            batch = next(self._gen)
        except StopIteration:
            if self._position is not None:
                self._position.active = False
            raise
        if self._position is not None:
            self._position.received += 1
        return batch

    def close(self) -> None:
        self._gen.close()

    def _prep(self) -> dali.Prep:
        ds, loader = self._ds, self._loader
        gpu, cuda_torch = self._device == "gpu", torch.cuda.is_available()
        recipe = dali.Recipe(ds.transform, ds.size, ds.seed, layout="CHW", device=self._device)
        return dali.Prep(recipe, _batch_size(loader), dali_threads(loader.num_workers),
                         device_id=(torch.cuda.current_device() if cuda_torch else 0) if gpu else None,
                         depth=loader.prefetch_factor or 2, export=_gpu_export if gpu and cuda_torch else None)

    def _run(self):
        batches = iter(self._sampler)
        prep = self._prep()
        try:
            while True:
                while prep.pending < prep.depth and self._submit(prep, batches):
                    pass
                if not prep.pending:
                    return
                images, labels = self._finish(prep.take())
                yield Batch([images, labels])
        finally:
            del prep  # DALI's threads go with the pipeline

    def _submit(self, prep: dali.Prep, batches) -> bool:
        """Fetch and schedule the next batch of indices; False at the end of the epoch."""
        indices = next(batches, None)
        if indices is None:
            return False
        raws, items = daliflow.fetch(self._ds, indices)
        prep.submit(raws, items, int(getattr(indices, "epoch", 0)), tag=items)
        return True

    def _finish(self, result: dali.Result) -> tuple[torch.Tensor, Any]:
        kept = daliflow.settle(self._ds, result.tag, result.kept, result.errors)
        size = self._ds.size
        if not kept:
            images = torch.empty((0, 3, size, size), dtype=torch.uint8)
        elif isinstance(result.images, torch.Tensor):
            images = result.images
        else:
            images = torch.from_numpy(result.images)
            if self._device == "gpu" and torch.cuda.is_available():
                images = images.to(torch.device("cuda", torch.cuda.current_device()))
        if self._loader.pin_memory and images.device.type == "cpu" and torch.cuda.is_available():
            images = images.pin_memory()
        return images, self._labels(kept)

    def _labels(self, kept: list[int]):
        ds = self._ds
        if getattr(ds, "target_transform", None) is None:
            return torch.from_numpy(daliflow.labels_of(ds, kept))
        return torch.utils.data.default_collate([ds.target_transform(int(ds.manifest.labels[i])) for i in kept])


def dali_epoch(loader, sampler, dataset, position=None, device: str | None = None) -> DaliEpoch:
    """The batches of the loader's current epoch through DALI (``device``: "cpu" or "gpu";
    default the loader's ``dali_device`` attribute, else "cpu"); see `DaliEpoch` for the rest."""
    require_dali()
    device = device or getattr(loader, "dali_device", "cpu")
    if device not in dali.DEVICES:
        raise ConfigError(f"dali_device={device!r}: use 'cpu' or 'gpu'")
    if device == "gpu" and gpu_count() == 0:
        raise ConfigError("dali_device='gpu' but DALI sees no CUDA device (no GPU or no NVIDIA driver): "
                          "use dali_device='cpu' (the default)")
    return DaliEpoch(loader, sampler, dataset, position, device)
