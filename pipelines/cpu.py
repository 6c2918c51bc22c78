"""The CPU pipeline: encoded bytes -> uint8 HWC pixels, with Pillow (or pillow-simd).

`train`: RandomResizedCrop + horizontal flip; `val`: resize shorter side to
size/0.875 + center crop. `size` is an int (square) or (height, width), as
torchvision takes it (pipelines/crop.py `output_hw`; val resizes the shorter
side to max(h, w)/0.875); the output is uint8 (h, w, 3). Both are done with one `Image.resize(box=...)` on
the decoded image, after a DCT-domain reduced decode (`Image.draft`) whenever
the crop still has at least the output resolution at the reduced scale, and
a decode that stops below the last row the resize reads (pipelines/rows.py:
the rows under a random crop are never entropy-decoded). The flip happens
on the small resized image (in Pillow), then one flat copy into `out`.

JPEGs go through the region-of-interest decoder when it is built
(pipelines/roi.py, libjpeg-turbo without Pillow's decoder): only the
crop's columns are IDCT'd and colour-converted, the rows above it are
skipped and those below it never decoded, with the same DCT scale as `draft`
(`crop.scale_denom`). It gives the same pixels. What it leaves to Pillow is
only what it does not support (CMYK, YCCK); what it fails on raises.

Bad input raises `DecodeError` (coordl/errors.py), never garbage pixels:
unknown or empty bytes, truncated or corrupt data (coordl is at least as
strict as Pillow's full decode: pipelines/roi.py and pipelines/rows.py say
how, for the rows each decodes and those below), and images over Pillow's
decompression-bomb limit (`PIL.Image.MAX_IMAGE_PIXELS`; the message says how
to raise it). 16-bit greyscale (PNG, TIFF) is scaled to 8 bits.

This module knows pixels, never where bytes come from: errors carry no file
name; the caller (coordl.datasets.imagefolder) adds it.
"""

from __future__ import annotations

import io
import random

import numpy as np
from PIL import Image, UnidentifiedImageError

from coordl.errors import DecodeError

from . import crop, markers, rows
from . import roi as jpegroi

__all__ = ["DecodeError", "check_pixels", "decode", "open_image", "train", "val"]

BILINEAR = Image.Resampling.BILINEAR
FLIP_LEFT_RIGHT = Image.Transpose.FLIP_LEFT_RIGHT
#: Pillow's modes for 16-bit greyscale; convert("RGB") would clip them (all white).
_SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def check_pixels(width: int, height: int) -> None:
    """DecodeError when width x height is where Pillow refuses an image as a decompression bomb.

    Pillow warns above `PIL.Image.MAX_IMAGE_PIXELS` (None: no limit) and raises
    `DecompressionBombError` above twice that; coordl refuses exactly what Pillow
    refuses (a genuine 100-megapixel photo still loads, as under torchvision), but
    as a DecodeError, so the message names the file and `on_error="skip"` skips it.
    """
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > 2 * limit:
        raise DecodeError(
            f"image is {width}x{height} = {width * height:,} pixels, over the decompression-bomb "
            f"limit of {2 * limit:,} pixels (twice PIL.Image.MAX_IMAGE_PIXELS, where Pillow refuses "
            f"an image): if the file is genuine, raise the limit (PIL.Image.MAX_IMAGE_PIXELS = "
            f"{width * height // 2 + 1}, or None for none) in the training script before the loader "
            "starts its workers")


def open_image(raw: bytes | memoryview) -> Image.Image:
    """Open (lazily) an encoded image; raises DecodeError for empty, unknown or too large images."""
    if len(raw) == 0:
        raise DecodeError("the file is empty (0 bytes)")
    try:
        img = Image.open(io.BytesIO(raw))
    except UnidentifiedImageError:
        head = bytes(raw[:8])
        raise DecodeError(f"not an image format Pillow can read (starts with {head!r})") from None
    except Image.DecompressionBombError as e:  # over twice the limit: Pillow names no size we need
        raise DecodeError(f"{e}; raise PIL.Image.MAX_IMAGE_PIXELS (None: no limit) in the "
                          "training script before the loader starts its workers") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise DecodeError(f"cannot open image: {e}") from None
    check_pixels(*img.size)
    return img


def _load_rgb(img: Image.Image) -> Image.Image:
    try:
        img.load()
    except (OSError, ValueError, SyntaxError) as e:  # truncated data, broken stream
        raise DecodeError(f"cannot decode image ({img.format}): {e}") from None
    if img.mode == "RGB":
        return img
    if img.mode in _SIXTEEN_BIT or (img.mode == "I" and img.format == "PNG"):
        # 16-bit greyscale: keep the high byte (PNG's "I" is 16-bit too, in older Pillow)
        wide = np.clip(np.asarray(img, dtype=np.int64), 0, 65535) if img.mode == "I" else np.asarray(img)
        img = Image.fromarray((wide >> 8).astype(np.uint8), "L")
    return img.convert("RGB")


def _decode_for(img: Image.Image, raw, box, size, partial: bool) -> Image.Image:
    """The decoded RGB image, or only its top rows when that is all the resize of `box` reads."""
    if img.format == "JPEG":
        markers.check(raw, img)  # what Pillow's full decode rejects, wherever the crop is
    if partial and rows.can_stop_early(img):
        top = rows.top_rows(img, raw, rows.rows_for_box(box, crop.output_hw(size)[0]))
        if top is not None:
            return top
    return _load_rgb(img)


def _draft(img: Image.Image, box: tuple[float, float, float, float], size) -> tuple:
    """Ask a JPEG for the DCT-scaled decode `crop.scale_denom` picks; return the box rescaled."""
    if img.format != "JPEG":
        return box
    full_w, full_h = img.size
    denom = crop.scale_denom(box, size, (full_w, full_h))
    if denom == 1:
        return box
    img.draft("RGB", (full_w // denom, full_h // denom))  # Pillow's draft then scales by exactly denom
    sx, sy = img.size[0] / full_w, img.size[1] / full_h
    return box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy


def _resize_into(img: Image.Image, box, size, flip: bool, out: np.ndarray | None) -> np.ndarray:
    left, top, w, h = box
    out_h, out_w = crop.output_hw(size)
    small = img.resize((out_w, out_h), BILINEAR, box=(left, top, left + w, top + h))
    if flip:  # in Pillow, on 4-byte pixels: a numpy copy with a negative stride is 5x slower
        small = small.transpose(FLIP_LEFT_RIGHT)
    packed = np.frombuffer(small.tobytes("raw", "RGB"), dtype=np.uint8)  # RGB, or RGBX from roi
    if out is None:
        out = np.empty((out_h, out_w, 3), dtype=np.uint8)
    if out.flags.c_contiguous:
        out.reshape(-1)[:] = packed  # one flat memcpy
    else:
        out[...] = packed.reshape(out_h, out_w, 3)
    return out


def _size_of(img: Image.Image | None) -> tuple[int, int]:
    if img is None:
        raise RuntimeError("no image and no ROI size: _roi_size decides which one train() has")
    return img.size


def _roi_size(raw, use: bool) -> tuple[int, int] | None:
    """The JPEG's (width, height) when the ROI decoder is to decode it, else None (Pillow path)."""
    if not (use and jpegroi.AVAILABLE and jpegroi.is_jpeg(raw)):
        return None
    width, height, supported = jpegroi.header(raw)  # DecodeError: libjpeg rejects the header
    check_pixels(width, height)
    return (width, height) if supported else None  # CMYK/YCCK: Pillow


def train(raw, size: int | tuple[int, int], rng: random.Random, out: np.ndarray | None = None,
          draft: bool = True, partial: bool = True, roi: bool = True) -> np.ndarray:
    """RandomResizedCrop(size) + RandomHorizontalFlip, as uint8 (h, w, 3) (size: int or (h, w)).

    `draft` (DCT-scaled decode) and `partial` (stop below the crop) are the
    two decode shortcuts; turning them off gives the full-decode reference.
    `roi` (with `partial`): decode JPEGs with pipelines/roi.py when it is built.
    """
    roi_size = _roi_size(raw, roi and partial)
    img = None if roi_size else open_image(raw)
    box = crop.random_resized_crop_box(*(roi_size or _size_of(img)), rng)
    do_flip = crop.flip(rng)
    if roi_size:
        got = jpegroi.region_image(raw, box, size, roi_size, draft)  # DecodeError: corrupt
        if got is not None:
            return _resize_into(*got, size, do_flip, out)
    if img is None:
        img = open_image(raw)  # a colour space the ROI decoder leaves to Pillow
    if draft:
        box = _draft(img, box, size)
    return _resize_into(_decode_for(img, raw, box, size, partial), box, size, do_flip, out)


def val(raw, size: int | tuple[int, int], out: np.ndarray | None = None, draft: bool = True,
        partial: bool = True, roi: bool = True) -> np.ndarray:
    """Resize(max(h, w) / 0.875) + CenterCrop((h, w)), as uint8 (h, w, 3) (size: int or (h, w))."""
    roi_size = _roi_size(raw, roi and partial)
    if roi_size:
        got = jpegroi.region_image(raw, crop.center_crop_box(*roi_size, size), size, roi_size, draft)
        if got is not None:
            return _resize_into(*got, size, False, out)
    img = open_image(raw)
    box = crop.center_crop_box(*img.size, size)
    if draft:
        box = _draft(img, box, size)
    return _resize_into(_decode_for(img, raw, box, size, partial), box, size, False, out)


def decode(raw) -> Image.Image:
    """Full decode to an RGB PIL image (transform=None, user callables)."""
    img = open_image(raw)
    if img.format == "JPEG":
        markers.check(raw, img)
    return _load_rgb(img)
