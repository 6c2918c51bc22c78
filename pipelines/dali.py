"""The DALI pipeline: batches of encoded bytes -> uint8 (or normalized float) pixels, with NVIDIA DALI.

    bytes ─ fn.external_source("jpegs") ─┐
    crop windows (host) ─ external_source ┼─> fn.decoders.image_slice   (ROI decode; "mixed" on a GPU)
                                          ├─> fn.resize(size x size, linear, antialiased, ROI = the box)
    flip (host) ─ external_source ────────┴─> fn.crop_mirror_normalize (uint8 or float, CHW or HWC)

Augmentation is planned on the host, not by DALI's RNG: the crop box and
the flip of item i in epoch e are `crop.random_resized_crop_box` and
`crop.flip` drawn from `crop.item_rng(seed, e, i)`, the very calls of the
CPU pipeline (pipelines/cpu.py). So a batch is a pure function of
(seed, epoch, items) whatever the thread count, the batch size or the
backend, and the DALI pipeline's own seed plays no part (no DALI random
operator is used). That rules out `decoders.image_random_crop`, whose
windows come from DALI's per-pipeline RNG; `image_slice` decodes only the
window just as the fused operator does. The window is the box plus the few
pixels an antialiased resize reads around it (so edges match a resize of
the full image); `fn.resize`'s ROI then takes the exact (fractional) box.
`val` is the center box of Resize(size / 0.875) + CenterCrop(size).

Bytes are fed with `feed_input` (batch mode, variable batch size up to the
pipeline's batch size) and run with `schedule_run`, `depth` batches in
flight: the host plans and feeds batch k+depth while DALI's threads decode
batch k. DALI's *parallel* external source is not used: it runs the source
in worker processes, which would each have to attach the cache and count
reads, to do work (a header parse and a crop draw per item, ~10 us) that is
small next to the decode.

Errors: DALI's decoders ignore libjpeg's corrupt-data warnings (a JPEG cut
short and closed with an end marker, a stray marker in its data, no data at
all: each came out as a picture), so the host refuses, per item and before
DALI decodes, what the CPU pipeline refuses for the same crop box, with the
CPU pipeline's own checks: `roi.check_region` (libjpeg entropy-decodes the
rows above the bottom of the region the CPU would decode, the bytes below
are scanned for markers) or, without the extension or for a colour space it
leaves to Pillow, `markers.check` (the Pillow path's). An unreadable header
(not an image, empty) is refused as `cpu.open_image` refuses it. A format
that Pillow reads and DALI is not given (GIF, TIFF, WebP, ...: anything but
JPEG, PNG and BMP) is decoded on the host by `cpu.decode` and handed to DALI
as a PPM, so the verdict and the pixels are the CPU's. A failure inside DALI
invalidates the whole pipeline and does not say which sample it was: the
pipeline is rebuilt (~3 ms) and that batch is decoded one sample at a time
to find the culprit(s), then the batches that were in flight are fed again.
Errors carry no file name (this module knows pixels, not files); the caller
adds it.

DALI is optional: importing this module does not import it; `require()`
says how to install it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordl.errors import ConfigError

from . import cpu, crop, markers
from . import roi as jpegroi
from .names import DALI_DEVICES, TRANSFORMS

DEVICES = DALI_DEVICES  # (pipelines/names.py)
LAYOUTS = ("CHW", "HWC")
INSTALL_HINT = "pip install -e '.[dali]' (NVIDIA DALI, the CUDA 12 wheel nvidia-dali-cuda120)"
_DALI_ERRORS = (RuntimeError, IndexError, ValueError)
#: formats DALI decodes from the file's bytes; Pillow decodes any other on the host
DALI_FORMATS = frozenset({"JPEG", "PNG", "BMP"})


def gpu_count() -> int:
    """CUDA devices DALI sees (0 without a GPU or driver); torch may be a CPU-only build."""
    import nvidia.dali.backend as backend

    return int(getattr(backend, "GetCUDADeviceCount")())  # noqa: B009 (not in DALI's stubs)


def require():
    """The `nvidia.dali` module, or ConfigError saying how to install it."""
    try:
        import nvidia.dali as dali
    except ImportError as e:
        raise ConfigError(f"backend='dali' needs NVIDIA DALI, which cannot be imported ({e}): "
                          f"{INSTALL_HINT}, or leave backend unset for the CPU pipeline") from None
    return dali


@dataclass(frozen=True)
class Recipe:
    """What the pipeline computes. mean/std (0-255 scale, as DALI takes them, one per
    channel): float32 output normalized as (x - mean) / std; None: uint8."""

    transform: str = "train"
    size: int = 224
    seed: int = 0
    layout: str = "CHW"
    device: str = "cpu"              # "gpu": nvJPEG ("mixed") decode, resize and normalize on the GPU
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.transform not in TRANSFORMS:
            raise ConfigError(f"transform={self.transform!r}: the DALI pipeline runs 'train' or 'val'")
        if isinstance(self.size, tuple):  # ImageFolder(size=(h, w)) with h != w
            raise ConfigError(f"size={self.size!r}: the DALI backend makes square images only: pass "
                              "ImageFolder(size=<one int>), or backend='cpu' for size=(height, width)")
        if not (isinstance(self.size, int) and self.size > 0):
            raise ConfigError(f"size={self.size!r} must be a positive int (output height and width)")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout={self.layout!r}: use 'CHW' or 'HWC'")
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r}: use 'cpu' or 'gpu'")
        if (self.mean is None) != (self.std is None):
            raise ConfigError(f"mean={self.mean!r}, std={self.std!r}: give both (float output) or neither")
        if self.std is not None and self.mean is not None and (
                len(self.std) != 3 or len(self.mean) != 3 or min(self.std) <= 0):
            raise ConfigError(f"mean={self.mean!r}, std={self.std!r}: three values each, std > 0")


# -- planning: pure functions of (bytes, item, epoch, recipe), no DALI ------------------------

@dataclass(frozen=True)
class Source:
    """One file as the host found it: the bytes DALI decodes, the image's size, its format, and
    whether its verdict waits for the crop box (a JPEG the region decoder checks)."""

    raw: Any
    width: int
    height: int
    format: str
    check_box: bool = False


def examine(raw) -> Source:
    """What DALI is given for `raw`; DecodeError for what the CPU pipeline refuses whatever the crop."""
    if len(raw) == 0:
        raise cpu.DecodeError("the file is empty (0 bytes)")
    if jpegroi.AVAILABLE and jpegroi.is_jpeg(raw):
        width, height, supported = jpegroi.header(raw)  # DecodeError: libjpeg rejects the header
        cpu.check_pixels(width, height)
        if supported:
            return Source(raw, width, height, "JPEG", check_box=True)
    img = cpu.open_image(raw)  # DecodeError: empty, not an image, a decompression bomb
    if img.format == "JPEG":
        markers.check(raw, img)  # what the CPU's Pillow path checks before it decodes
    elif img.format not in DALI_FORMATS:
        return Source(_ppm(cpu.decode(raw)), *img.size, img.format or "unknown")
    return Source(raw, *img.size, img.format or "unknown")


def _ppm(img) -> bytes:
    """An RGB PIL image as binary PPM, which DALI decodes losslessly."""
    return b"P6\n%d %d\n255\n" % img.size + img.tobytes()


def box_for(recipe: Recipe, width: int, height: int, item: int, epoch: int) -> tuple[tuple, bool]:
    """(box (left, top, w, h) in image pixels, flip): the CPU pipeline's draws for this item."""
    if recipe.transform == "val":
        return crop.center_crop_box(width, height, recipe.size), False
    rng = crop.item_rng(recipe.seed, epoch, item)
    box = crop.random_resized_crop_box(width, height, rng)
    return box, crop.flip(rng)


def window_for(box, size: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(slice anchor [x, y], slice shape [w, h], resize roi_start [y, x], roi_end [y, x]).

    The slice is the box plus what an antialiased linear resize to `size` reads
    past each side (`roi.region_for_box`); the ROI is the box within the slice.
    """
    x0, y0, x1, y1 = jpegroi.region_for_box(box, size, width, height)
    left, top, w, h = box
    start = np.array([top - y0, left - x0], dtype=np.float32)
    return (np.array([x0, y0], dtype=np.int32), np.array([x1 - x0, y1 - y0], dtype=np.int32),
            start, start + np.array([h, w], dtype=np.float32))


@dataclass
class Planned:
    """One batch planned on the host: the inputs DALI is fed and the positions it refused."""

    tag: Any
    run: list[int] = field(default_factory=list)      # positions fed to DALI, in order
    inputs: dict[str, list] = field(default_factory=lambda: collections.defaultdict(list))
    errors: dict[int, cpu.DecodeError] = field(default_factory=dict)
    formats: list[str] = field(default_factory=list)  # of the positions in `run`


def plan(recipe: Recipe, raws, items, epoch: int, tag: Any = None) -> Planned:
    """The host half of a batch: per item its window and flip, or its DecodeError."""
    batch = Planned(tag)
    for pos, (raw, item) in enumerate(zip(raws, items)):
        try:
            found = examine(raw)
            box, flip = box_for(recipe, found.width, found.height, int(item), epoch)
            if found.check_box:  # the CPU pipeline's verdict for this box (roi.decode_region's)
                jpegroi.check_region(raw, box, recipe.size, (found.width, found.height))
        except cpu.DecodeError as e:
            batch.errors[pos] = e
            continue
        anchor, shape, roi_start, roi_end = window_for(box, recipe.size, found.width, found.height)
        for name, value in (("jpegs", np.frombuffer(found.raw, dtype=np.uint8)), ("anchor", anchor),
                            ("shape", shape), ("roi_start", roi_start), ("roi_end", roi_end),
                            ("mirror", np.array(int(flip), dtype=np.int32))):
            batch.inputs[name].append(value)
        batch.run.append(pos)
        batch.formats.append(found.format)
    return batch


# -- the DALI graph --------------------------------------------------------------------------

def build_pipeline(recipe: Recipe, batch_size: int, num_threads: int, device_id: int | None):
    """A built DALI pipeline for `recipe`; its inputs are the names `plan` fills.

    ``prefetch_queue_depth=1`` with the dynamic executor: the first `schedule_run` of a
    deeper queue runs that many iterations at once (DALI's prefetch), which fed inputs
    cannot serve; with depth 1 every `schedule_run` is one iteration, and the dynamic
    executor still takes several scheduled runs before the first `outputs()`.
    """
    require()
    import nvidia.dali.fn as dali_fn
    import nvidia.dali.types as dali_types
    from nvidia.dali.pipeline import pipeline_def as dali_pipeline_def

    # DALI's operators and type constants are generated at import: its stubs do not know them
    fn: Any = dali_fn
    types: Any = dali_types
    pipeline_def: Any = dali_pipeline_def

    if recipe.device == "gpu" and device_id is None:
        raise ConfigError("device='gpu' needs a device_id (the CUDA device to run on)")
    gpu = recipe.device == "gpu"

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id if gpu else None,
                  seed=0, prefetch_queue_depth=1, exec_dynamic=True)
    def graph():
        def source(name, dtype, ndim):
            return fn.external_source(name=name, dtype=dtype, ndim=ndim)
        jpegs = source("jpegs", types.UINT8, 1)
        images = fn.decoders.image_slice(
            jpegs, source("anchor", types.INT32, 1), source("shape", types.INT32, 1),
            device="mixed" if gpu else "cpu", output_type=types.RGB, adjust_orientation=False,
            jpeg_fancy_upsampling=True)  # libjpeg's default, what Pillow decodes with
        images = fn.resize(images, size=[recipe.size, recipe.size], interp_type=types.INTERP_LINEAR,
                           antialias=True, roi_start=source("roi_start", types.FLOAT, 1),
                           roi_end=source("roi_end", types.FLOAT, 1))
        norm = {} if recipe.mean is None or recipe.std is None else \
            {"mean": list(recipe.mean), "std": list(recipe.std)}
        return fn.crop_mirror_normalize(images, dtype=types.UINT8 if recipe.mean is None else types.FLOAT,
                                        output_layout=recipe.layout,
                                        mirror=source("mirror", types.INT32, 0), **norm)

    pipe = graph()
    pipe.build()
    return pipe


def _dali_message(e: Exception) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    for k, line in enumerate(lines[:-1]):
        if line.startswith("encountered"):
            return lines[k + 1]
    return lines[-1] if lines else type(e).__name__


def to_numpy(tensors) -> np.ndarray:
    """A dense DALI TensorList as a new numpy array (copied off the GPU when it is there)."""
    if hasattr(tensors, "as_cpu"):
        tensors = tensors.as_cpu()
    return tensors.as_array()


@dataclass
class Result:
    """One batch out: `images` of the kept positions, in order; `errors` by position."""

    tag: Any
    images: Any                        # numpy (or what `export` made of the DALI TensorList)
    kept: list[int]
    errors: dict[int, cpu.DecodeError]


class Prep:
    """Encoded bytes -> pixels through one DALI pipeline, up to `depth` batches in flight.

    `submit(raws, items, epoch, tag)` plans and schedules a batch; `take()` returns the
    oldest one as a `Result`. `export(tensor_list)` turns DALI's output into what
    `Result.images` holds (default: a numpy copy); it runs before DALI reuses the buffer.
    """

    def __init__(self, recipe: Recipe, batch_size: int, num_threads: int = 1,
                 device_id: int | None = None, depth: int = 2,
                 export: Callable[[Any], Any] | None = None) -> None:
        if not (isinstance(batch_size, int) and batch_size > 0):
            raise ConfigError(f"batch_size={batch_size!r} must be a positive int")
        self.recipe, self.batch_size, self.depth = recipe, batch_size, max(1, int(depth))
        self._args = (recipe, batch_size, max(1, int(num_threads)), device_id)
        self._export = export or to_numpy
        self._pipe: Any = build_pipeline(*self._args)
        self._flight: collections.deque[Planned] = collections.deque()
        self.rebuilds = 0

    @property
    def pending(self) -> int:
        return len(self._flight)

    def submit(self, raws, items, epoch: int, tag: Any = None) -> None:
        if len(raws) > self.batch_size:
            raise ConfigError(f"a batch of {len(raws)} items exceeds the pipeline's batch_size={self.batch_size}")
        if len(self._flight) >= self.depth:
            raise ConfigError(f"{self.depth} batches are in flight (depth={self.depth}): take() one first")
        batch = plan(self.recipe, raws, items, epoch, tag)
        self._schedule(batch)
        self._flight.append(batch)

    def _schedule(self, batch: Planned) -> None:
        if batch.run:
            for name, values in batch.inputs.items():
                self._pipe.feed_input(name, values)
            self._pipe.schedule_run()

    def take(self) -> Result:
        """The oldest batch in flight, decoded (one sample at a time if DALI failed on it)."""
        batch = self._flight.popleft()
        if not batch.run:
            return Result(batch.tag, None, [], batch.errors)
        try:
            images = self._export(self._pipe.outputs()[0])
        except _DALI_ERRORS:
            lost = list(self._flight)  # the pipeline is gone, with every run scheduled after this one
            self._flight.clear()
            self._rebuild()
            result = self._one_by_one(batch)
            for other in lost:
                self._schedule(other)
                self._flight.append(other)
            return result
        return Result(batch.tag, images, batch.run, batch.errors)

    def _rebuild(self) -> None:
        self._pipe = None  # DALI says the object is "no longer valid": drop it, threads and all
        self._pipe = build_pipeline(*self._args)
        self.rebuilds += 1

    def _one_by_one(self, batch: Planned) -> Result:
        parts, kept = [], []
        for k, pos in enumerate(batch.run):
            for name, values in batch.inputs.items():
                self._pipe.feed_input(name, values[k:k + 1])
            self._pipe.schedule_run()
            try:
                parts.append(to_numpy(self._pipe.outputs()[0]))
                kept.append(pos)
            except _DALI_ERRORS as e:
                batch.errors[pos] = cpu.DecodeError(
                    f"DALI cannot decode it (a {batch.formats[k]} image): {_dali_message(e)}")
                self._rebuild()
        images = np.concatenate(parts) if parts else None
        return Result(batch.tag, images, kept, dict(sorted(batch.errors.items())))

    def prep_into(self, raws, items, epoch: int, out: np.ndarray) -> tuple[list[int], dict[int, cpu.DecodeError]]:
        """Prepare one batch synchronously into `out` (n >= len(raws) rows, the recipe's layout).

        Kept samples fill out[0:len(kept)] in order; returns (kept positions, errors by
        position). What the coordinator's prep workers call (see docs/dali.md).
        """
        if self._flight:
            raise ConfigError("prep_into() with batches in flight: take() them first")
        self.submit(raws, items, epoch)
        result = self.take()
        if result.kept:
            images = result.images if isinstance(result.images, np.ndarray) else to_numpy(result.images)
            rows = out[:len(result.kept)]
            if images.shape != rows.shape or images.dtype != rows.dtype:
                raise ConfigError(f"prep_into: out rows are {rows.dtype} {rows.shape[1:]}, the recipe makes "
                                  f"{images.dtype} {images.shape[1:]} (layout={self.recipe.layout!r}): "
                                  "pass an array of the recipe's layout, size and dtype")
            rows[...] = images
        return result.kept, result.errors

