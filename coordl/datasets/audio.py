"""`coordl.AudioFolder`: class folders of WAV/FLAC files, one fixed-length window per item.

    fetch(i) -> bytes                          storage (or the MinIO / partitioned cache) only
    prep(raw, i, epoch) -> (waveform, label)   decode + window (+ resample): pipelines/audio.py

A waveform is float32 (channels, samples) with samples = round(sample_rate *
seconds); `coordl.DataLoader` hands out batches (B, channels, samples) and
int64 labels. `__getitems__` stacks a batch into one tensor, in shared memory
inside a worker, so it reaches the training process by file descriptor.

The window of item i in epoch e is a pure function of (seed, e, i) (pipelines/
crop.py `item_rng`): batches are identical whatever `num_workers` is, and
resume and rank shares are exact, as for `coordl.ImageFolder`. Caches hold the
encoded file bytes, never waveforms.

The coordinator daemon serves it (``coordl serve --dataset
coordl.datasets.audio:AudioFolder --dataset-args '{"root": ...}'``): its ring
holds float32 (channels, samples) rows (coordl/coordinator/spec.py), and a job
with another transform is refused (`served_settings`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from coordl import names
from coordl.batch import PreparedBatch
from coordl.buffers import new_shared
from coordl.cache.storage import localfile, readers
from coordl.datasets import admission
from coordl.datasets.base import CoordlDataset, epoch_of
from coordl.errors import ConfigError, SampleError
from coordl.manifest.build import scan
from coordl.pipelines import audio
from coordl.pipelines.crop import item_rng

AUDIO_EXTENSIONS: tuple[str, ...] = (".wav", ".flac")


def _check(sample_rate: Any, seconds: Any, transform: Any, channels: Any, on_error: Any) -> None:
    if not (type(sample_rate) is int and sample_rate > 0):
        raise ConfigError(f"sample_rate={sample_rate!r} must be a positive int in Hz, e.g. sample_rate=16000")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ConfigError(f"seconds={seconds!r} must be a positive number: the window's length, e.g. seconds=1.0")
    if transform not in audio.TRANSFORMS:
        raise ConfigError(f"transform={transform!r} is not known: use 'train' (random window) or 'val' (centred)")
    if channels is not None and not (type(channels) is int and channels > 0):
        raise ConfigError(f"channels={channels!r} must be None (each file's own), 1 (mix down) or a "
                          "positive int (a mono file is repeated)")
    if on_error not in names.ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} must be 'raise' or 'skip'")


class AudioFolder(CoordlDataset):
    """A map-style dataset over ``root/<class>/<file>.wav|.flac``.

    Args:
        root: folder with one sub-folder per class.
        sample_rate: the output rate in Hz; files at another rate are resampled with
            soxr (a ConfigError naming both rates when soxr is not installed).
        seconds: the window's length; items are float32 (channels, round(sample_rate * seconds)).
        transform: ``"train"`` (a random window per (seed, epoch, item)) or ``"val"``
            (the centred window). A shorter clip starts at 0 and is zero-padded.
        seed: the windows' seed.
        on_error: ``"raise"`` (a bad file raises `SampleError` naming it) or ``"skip"``
            (dropped from its batch and counted).
        channels: None keeps each file's channels (a batch must then agree), 1 averages
            them, n > 1 repeats a mono file.
        extensions, target_transform, rescan, manifest_cache: as for `coordl.ImageFolder`.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        sample_rate: int = 16000,
        seconds: float = 1.0,
        transform: str = "train",
        seed: int = 0,
        on_error: str = "raise",
        channels: int | None = None,
        extensions: Sequence[str] = AUDIO_EXTENSIONS,
        target_transform: Callable | None = None,
        rescan: bool = False,
        manifest_cache: str | None = None,
    ) -> None:
        _check(sample_rate, seconds, transform, channels, on_error)
        audio.soundfile()  # refuse now, not in a worker, when soundfile is missing
        self.manifest = scan(os.fspath(root), extensions, None, allow_empty=on_error == "skip",
                             rescan=rescan, manifest_cache=manifest_cache)
        self.root = self.manifest.root
        self.sample_rate, self.seconds, self.channels = sample_rate, float(seconds), channels
        self.length = audio.window_length(sample_rate, seconds)
        self.transform, self.seed, self.on_error = transform, int(seed), on_error
        self.target_transform = target_transform
        self.classes = list(self.manifest.classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.epoch = 0
        # counters, cache, drop_page_cache, batch_slots and coordinator are the loader's: a bound
        # copy reads them from its binding (CoordlDataset, coordl/datasets/binding.py); nothing here sets them

    @property
    def fingerprint(self) -> str:
        """The manifest's fingerprint: changes whenever any item's bytes change (cache keys carry it)."""
        return self.manifest.fingerprint

    @property
    def targets(self) -> list[int]:
        """The class index of every item, in item order (as torchvision's ``targets``)."""
        return self.manifest.labels.tolist()

    def __len__(self) -> int:
        return len(self.manifest)

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose augmentation `__getitem__` draws (coordl.DataLoader sets it each epoch)."""
        self.epoch = int(epoch)

    # -- the two halves (the contract's: uncounted; the base class's fetch/_prep count them) --
    def read(self, i: int) -> bytes:
        """Item i's bytes from storage (uncounted, uncached: `fetch` does both)."""
        path = self.manifest.path(i)
        try:
            return localfile.read_file(path, drop_page_cache=self.drop_page_cache,
                                     expect=readers.listed(self.manifest, i))
        except OSError as e:
            raise SampleError(f"{path}: cannot read the file ({e.strerror or e}): check that it "
                              "exists and is readable, or pass on_error='skip'") from None

    def prep(self, raw, i: int, epoch: int | None = None, out: np.ndarray | None = None):
        """Decode item i's bytes and cut its window: (float32 tensor (channels, samples), label)
        (uncounted: the base class counts the decode)."""
        epoch = self.epoch if epoch is None else epoch
        return torch.from_numpy(self._window(raw, i, epoch, out)), self._target(i)

    def prep_window(self, raw, i: int, epoch: int, out: np.ndarray | None = None) -> np.ndarray:
        """Item i's window as float32 (channels, samples), counted as one decode."""
        self.counters.add(decodes=1)
        return self._window(raw, i, epoch, out)

    def _window(self, raw, i: int, epoch: int, out: np.ndarray | None = None) -> np.ndarray:
        """Item i's window; a bad file is a SampleError naming it."""
        rng = item_rng(self.seed, epoch, i) if self.transform == "train" else None
        try:
            return audio.window(raw, self.sample_rate, self.length, self.transform, rng, self.channels, out)
        except SampleError as e:
            raise SampleError(f"{self.manifest.path(i)}: {e}: replace or remove the file, "
                              "or pass on_error='skip'") from None

    def _target(self, i: int):
        label = int(self.manifest.labels[i])
        return label if self.target_transform is None else self.target_transform(label)

    def __getitems__(self, indices: Sequence[int]) -> PreparedBatch:
        """One batch: waveforms (B, channels, samples) float32 and labels, bad items skipped or raised."""
        epoch = epoch_of(indices, self.epoch)
        cache = self.cache
        hits = cache.get_many([int(i) for i in indices], self.counters) if hasattr(cache, "get_many") else None
        rows: list[np.ndarray] = []
        kept: list[int] = []
        with admission.admitting(self):  # a read is cached once its prep succeeded
            for i in indices:
                i = int(i)
                try:
                    raw = None if hits is None else hits.get(i)
                    if raw is None:
                        raw = self.fetch(i) if hits is None else self._read(i)
                    rows.append(self.prep_window(raw, i, epoch))
                    admission.admit(self, i)  # its bytes, if just read, go to the cache now
                except SampleError:
                    if self.on_error == "raise":
                        raise
                    self.counters.add(errors_skipped=1)
                    continue
                kept.append(i)
        self.counters.add(samples=len(kept))
        waves = self._stack(rows, kept)
        targets = torch.from_numpy(self.manifest.labels[kept].astype(np.int64)) if self.target_transform is None \
            else torch.utils.data.default_collate([self._target(i) for i in kept])
        return PreparedBatch(waves, targets, kept)

    def _stack(self, rows: list[np.ndarray], kept: list[int]) -> torch.Tensor:
        """(B, channels, samples) float32; in shared memory in a worker process."""
        counts = {r.shape[0] for r in rows}
        if len(counts) > 1:
            first = {r.shape[0]: i for r, i in zip(rows, kept)}
            names = ", ".join(f"{self.manifest.path(i)} ({c} channels)" for c, i in sorted(first.items()))
            raise ConfigError(f"one batch mixes channel counts: {names}: pass AudioFolder(channels=1) to "
                              "mix every file down to mono, or channels=2 to repeat mono files")
        shape = (len(rows), int(counts.pop() if counts else (self.channels or 1)), self.length)
        if torch.utils.data.get_worker_info() is None:
            waves = torch.empty(shape, dtype=torch.float32)
        else:
            storage_ = new_shared(int(np.prod(shape)) * 4)
            # torch's stubs lack set_'s (UntypedStorage, offset, size) overload; torch has it
            waves = torch.empty(0, dtype=torch.float32).set_(storage_, 0, shape)  # pyright: ignore[reportCallIssue]
            self.counters.add(batch_buffers=1)
        if rows:
            np.stack(rows, out=waves.numpy())
        return waves

    def served_settings(self) -> str:
        """A train window (random offset) and a val window (centred) have the same shape: the
        coordinator compares this text, so a val job never gets a train daemon's batches."""
        return f"transform={self.transform!r}"

    def __repr__(self) -> str:
        return (f"AudioFolder(root={self.root!r}, items={len(self)}, classes={len(self.classes)}, "
                f"sample_rate={self.sample_rate}, seconds={self.seconds}, transform={self.transform!r})")
