"""The CPU pipeline: encoded bytes -> uint8 HWC pixels, with Pillow (or pillow-simd).

`train`: RandomResizedCrop + horizontal flip; `val`: resize shorter side to
size/0.875 + center crop. Both are done with one `Image.resize(box=...)` on
the decoded image, after a DCT-domain reduced decode (`Image.draft`) whenever
the crop still has at least the output resolution at the reduced scale. The
flip happens while the resized pixels are copied into `out`, so it is free.

This module knows pixels, never where bytes come from: errors carry no file
name; the caller (coordl.dataset) adds it.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, UnidentifiedImageError

from coordl.errors import SampleError

from . import crop

BILINEAR = Image.Resampling.BILINEAR


class DecodeError(SampleError):
    """The bytes are not an image Pillow can decode, or the image is truncated."""


def open_image(raw: bytes | memoryview) -> Image.Image:
    """Open (lazily) an encoded image; raises DecodeError for empty or unknown bytes."""
    if len(raw) == 0:
        raise DecodeError("the file is empty (0 bytes)")
    try:
        return Image.open(io.BytesIO(raw))
    except UnidentifiedImageError:
        head = bytes(raw[:8])
        raise DecodeError(f"not an image format Pillow can read (starts with {head!r})") from None
    except (OSError, ValueError) as e:
        raise DecodeError(f"cannot open image: {e}") from None


def _load_rgb(img: Image.Image) -> Image.Image:
    try:
        img.load()
    except (OSError, ValueError, SyntaxError) as e:  # truncated data, broken stream
        raise DecodeError(f"cannot decode image ({img.format}): {e}") from None
    return img if img.mode == "RGB" else img.convert("RGB")


def _draft(img: Image.Image, box: tuple[float, float, float, float], size: int) -> tuple:
    """Ask a JPEG for a DCT-scaled decode that keeps the crop >= size; return the box rescaled."""
    if img.format != "JPEG":
        return box
    factor = min(box[2], box[3]) / size
    if factor < 2.0:
        return box
    full_w, full_h = img.size
    img.draft("RGB", (math.ceil(full_w / factor), math.ceil(full_h / factor)))
    sx, sy = img.size[0] / full_w, img.size[1] / full_h
    return box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy


def _resize_into(img: Image.Image, box, size: int, flip: bool, out: np.ndarray | None) -> np.ndarray:
    left, top, w, h = box
    small = img.resize((size, size), BILINEAR, box=(left, top, left + w, top + h))
    pixels = np.frombuffer(small.tobytes(), dtype=np.uint8).reshape(size, size, 3)
    if flip:
        pixels = pixels[:, ::-1]
    if out is None:
        out = np.empty((size, size, 3), dtype=np.uint8)
    out[...] = pixels
    return out


def train(raw, size: int, rng: np.random.Generator, out: np.ndarray | None = None,
          draft: bool = True) -> np.ndarray:
    """RandomResizedCrop(size) + RandomHorizontalFlip, as uint8 (size, size, 3)."""
    img = open_image(raw)
    box = crop.random_resized_crop_box(*img.size, rng)
    do_flip = crop.flip(rng)
    if draft:
        box = _draft(img, box, size)
    return _resize_into(_load_rgb(img), box, size, do_flip, out)


def val(raw, size: int, out: np.ndarray | None = None, draft: bool = True) -> np.ndarray:
    """Resize(size / 0.875) + CenterCrop(size), as uint8 (size, size, 3)."""
    img = open_image(raw)
    box = crop.center_crop_box(*img.size, size)
    if draft:
        box = _draft(img, box, size)
    return _resize_into(_load_rgb(img), box, size, False, out)


def decode(raw) -> Image.Image:
    """Full decode to an RGB PIL image (transform=None, user callables)."""
    return _load_rgb(open_image(raw))
