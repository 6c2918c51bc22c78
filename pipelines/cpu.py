"""The CPU pipeline: encoded bytes -> uint8 HWC pixels, with Pillow (or pillow-simd).

`train`: RandomResizedCrop + horizontal flip; `val`: resize shorter side to
size/0.875 + center crop. Both are done with one `Image.resize(box=...)` on
the decoded image, after a DCT-domain reduced decode (`Image.draft`) whenever
the crop still has at least the output resolution at the reduced scale, and
a decode that stops below the last row the resize reads (pipelines/rows.py:
the rows under a random crop are never entropy-decoded). The flip happens
on the small resized image (in Pillow), then one flat copy into `out`.

JPEGs go through the region-of-interest decoder when it is built
(pipelines/roi.py, libjpeg-turbo without Pillow's decoder): only the
crop's columns are IDCT'd and colour-converted, the rows above it are
skipped and those below it never read, with the same DCT scale as `draft`.
It gives the same pixels; anything it declines or fails on (CMYK, a libjpeg
warning Pillow tolerates, a broken file) takes the Pillow path, which
decodes it or raises Pillow's usual error.

This module knows pixels, never where bytes come from: errors carry no file
name; the caller (coordl.dataset) adds it.
"""

from __future__ import annotations

import io
import math
import random

import numpy as np
from PIL import Image, UnidentifiedImageError

from coordl.errors import SampleError

from . import crop, rows
from . import roi as jpegroi

BILINEAR = Image.Resampling.BILINEAR
FLIP_LEFT_RIGHT = Image.Transpose.FLIP_LEFT_RIGHT
#: A DCT-scaled decode must leave the crop at least this many times the output
#: size: closer to 1, the scaled IDCT's blur is not averaged away by the
#: resize and PSNR against a full decode drops below 35 dB (bench/results/quality.md).
DRAFT_MARGIN = 1.25


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


def _decode_for(img: Image.Image, raw, box, size: int, partial: bool) -> Image.Image:
    """The decoded RGB image, or only its top rows when that is all the resize of `box` reads."""
    if partial and rows.can_stop_early(img):
        top = rows.top_rows(img, raw, rows.rows_for_box(box, size))
        if top is not None:
            return top
    return _load_rgb(img)


def _draft(img: Image.Image, box: tuple[float, float, float, float], size: int) -> tuple:
    """Ask a JPEG for a DCT-scaled decode that keeps the crop >= size; return the box rescaled."""
    if img.format != "JPEG":
        return box
    factor = min(box[2], box[3]) / (size * DRAFT_MARGIN)
    if factor < 2.0:
        return box
    full_w, full_h = img.size
    img.draft("RGB", (math.ceil(full_w / factor), math.ceil(full_h / factor)))
    sx, sy = img.size[0] / full_w, img.size[1] / full_h
    return box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy


def _resize_into(img: Image.Image, box, size: int, flip: bool, out: np.ndarray | None) -> np.ndarray:
    left, top, w, h = box
    small = img.resize((size, size), BILINEAR, box=(left, top, left + w, top + h))
    if flip:  # in Pillow, on 4-byte pixels: a numpy copy with a negative stride is 5x slower
        small = small.transpose(FLIP_LEFT_RIGHT)
    packed = np.frombuffer(small.tobytes("raw", "RGB"), dtype=np.uint8)  # RGB, or RGBX from roi
    if out is None:
        out = np.empty((size, size, 3), dtype=np.uint8)
    if out.flags.c_contiguous:
        out.reshape(-1)[:] = packed  # one flat memcpy
    else:
        out[...] = packed.reshape(size, size, 3)
    return out


def _roi_size(raw, use: bool) -> tuple[int, int] | None:
    """The JPEG's (width, height) when the ROI decoder is to decode it, else None (Pillow path)."""
    if not (use and jpegroi.AVAILABLE and jpegroi.is_jpeg(raw)):
        return None
    try:
        width, height, supported = jpegroi.header(raw)
    except DecodeError:
        return None  # the Pillow path reports it
    if not supported or (Image.MAX_IMAGE_PIXELS and width * height > Image.MAX_IMAGE_PIXELS):
        return None  # CMYK/YCCK; huge images get Pillow's decompression-bomb check
    return width, height


def _roi_region(raw, box, size: int, image_size: tuple[int, int], scale: bool):
    """(RGBX image of the region that resizing `box` reads, box within it), or None: use Pillow."""
    try:
        return jpegroi.region_image(raw, box, size, image_size, scale)
    except DecodeError:
        # libjpeg-turbo stopped on an error or on a warning (corrupt data): the Pillow path
        # raises its own error, or decodes what Pillow tolerates, as without the ROI decoder
        return None


def train(raw, size: int, rng: random.Random, out: np.ndarray | None = None,
          draft: bool = True, partial: bool = True, roi: bool = True) -> np.ndarray:
    """RandomResizedCrop(size) + RandomHorizontalFlip, as uint8 (size, size, 3).

    `draft` (DCT-scaled decode) and `partial` (stop below the crop) are the
    two decode shortcuts; turning them off gives the full-decode reference.
    `roi` (with `partial`): decode JPEGs with pipelines/roi.py when it is built.
    """
    roi_size = _roi_size(raw, roi and partial)
    img = None if roi_size else open_image(raw)
    box = crop.random_resized_crop_box(*(roi_size or img.size), rng)
    do_flip = crop.flip(rng)
    if roi_size:
        got = _roi_region(raw, box, size, roi_size, draft)
        if got is not None:
            return _resize_into(*got, size, do_flip, out)
        img = open_image(raw)
    if draft:
        box = _draft(img, box, size)
    return _resize_into(_decode_for(img, raw, box, size, partial), box, size, do_flip, out)


def val(raw, size: int, out: np.ndarray | None = None, draft: bool = True,
        partial: bool = True, roi: bool = True) -> np.ndarray:
    """Resize(size / 0.875) + CenterCrop(size), as uint8 (size, size, 3)."""
    roi_size = _roi_size(raw, roi and partial)
    if roi_size:
        got = _roi_region(raw, crop.center_crop_box(*roi_size, size), size, roi_size, draft)
        if got is not None:
            return _resize_into(*got, size, False, out)
    img = open_image(raw)
    box = crop.center_crop_box(*img.size, size)
    if draft:
        box = _draft(img, box, size)
    return _resize_into(_decode_for(img, raw, box, size, partial), box, size, False, out)


def decode(raw) -> Image.Image:
    """Full decode to an RGB PIL image (transform=None, user callables)."""
    return _load_rgb(open_image(raw))
