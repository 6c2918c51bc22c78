"""Decode only a crop's region of a JPEG (libjpeg-turbo, C extension `_jpegroi`).

What NVIDIA DALI's fused `decoders.image_random_crop` does on the CPU:
`jpeg_crop_scanline` limits every row to the crop's columns (aligned down to
an iMCU, 8 or 16 px), `jpeg_skip_scanlines` skips the rows above the crop
(Huffman-decoded but not IDCT'd, upsampled or colour-converted) and the rows
below it are never decoded. A DCT-scaled decode (1/2, 1/4, 1/8) is chosen by
`crop.scale_denom`, the rule pipelines/cpu.py gives `Image.draft`.

Corrupt data raises `DecodeError` (coordl/errors.py), never a picture of it,
so coordl is at least as strict as Pillow's full decode (`Image.load()`):
- libjpeg's corrupt-data warnings are errors, wherever the decoder reads: the
  region, the rows above it (Huffman-decoded to be skipped) and, for
  progressive and multi-scan files, the whole file (libjpeg reads every scan
  before the first row). Pillow ignores these warnings.
- A single-scan file's entropy-coded bytes below the region, which are never
  decoded, are scanned (memchr: ~25 us for a whole 100 KiB file, a few us for
  the eighth of it below a typical crop): a marker where only image data may
  be (any but RSTn, with a restart interval, and EOI) or no EOI at all (a
  truncated file) is an error. Those markers include every one that makes
  Pillow's full decode fail (`broken data stream`).
- What is left, a byte changed below the region without making a marker,
  changes no pixel returned (the scan decodes top to bottom), and Pillow's
  full decode passes it too (libjpeg only warns).

The region is the crop plus what Pillow's bilinear resampler reads around it
(see `rows.rows_for_box`) plus one column each side: libjpeg-turbo's fancy
upsampling treats a cropped row's first and last columns as image edges, so
those two columns differ from a full decode; every other pixel is
bit-identical to Pillow's decode of the same file with the same scale
(tests/pipelines/test_roi.py). Resizing the region therefore gives the same
pixels as resizing the full decode.

The extension is optional (setup.py builds it when a compiler and jpeglib.h
are there): `AVAILABLE` says whether it is, and callers fall back to Pillow.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from coordl.errors import DecodeError

from . import crop

try:
    from . import _jpegroi
except ImportError:  # not built: no compiler or no jpeglib.h at install time
    _jpegroi = None

AVAILABLE = _jpegroi is not None


def _lib():
    """The C extension; only called where AVAILABLE was checked (cpu.py, dali.py)."""
    if _jpegroi is None:
        raise RuntimeError("coordl.pipelines._jpegroi is not built: run install.sh (needs cc, Python.h, jpeglib.h)")
    return _jpegroi
#: Columns each side that libjpeg-turbo's cropped upsampling gets wrong (the edge columns).
EDGE = 1
_SOI = b"\xff\xd8\xff"


def is_jpeg(raw) -> bool:
    return bytes(raw[:3]) == _SOI


def header(raw) -> tuple[int, int, bool]:
    """(width, height, supported) from the JPEG header; DecodeError if it is not one."""
    try:
        return _lib().header(raw)
    except ValueError as e:
        raise _decode_error(e) from None


def region_for_box(box, size: int | tuple[int, int], width: int, height: int) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1): the pixels a bilinear, antialiased resize of `box` to size x size reads.

    Pillow's resampler reads `support = max(extent / size, 1)` pixels past each
    side of the box, plus half a pixel of rounding (as in `rows.rows_for_box`);
    one more column each side keeps the upsampling's edge columns out.
    """
    left, top, w, h = box
    out_h, out_w = crop.output_hw(size)  # size: an int or (h, w)
    sx, sy = max(w / out_w, 1.0), max(h / out_h, 1.0)
    x0 = max(math.floor(left - sx - 0.5) - 1 - EDGE, 0)
    y0 = max(math.floor(top - sy - 0.5) - 1, 0)
    x1 = min(math.ceil(left + w + sx + 0.5) + 1 + EDGE, width)
    y1 = min(math.ceil(top + h + sy + 0.5) + 1, height)
    return x0, y0, x1, y1


def scaled_region(box, size: int | tuple[int, int], image_size: tuple[int, int],
                  scale: bool = True) -> tuple[int, tuple, tuple]:
    """(DCT scale denominator, region (x0, y0, x1, y1), box): what `decode_region` decodes for `box`,
    the region and the box in the scaled image's pixels."""
    full_w, full_h = image_size
    denom = crop.scale_denom(box, size, image_size) if scale else 1
    # libjpeg's scaled size is ceil(full / denom); Pillow's draft rescales boxes the same way
    sw, sh = -(-full_w // denom), -(-full_h // denom)
    sx, sy = sw / full_w, sh / full_h
    scaled = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
    return denom, region_for_box(scaled, size, sw, sh), scaled


def check_region(raw, box, size: int | tuple[int, int], image_size: tuple[int, int], scale: bool = True) -> None:
    """DecodeError exactly where `decode_region` raises for `box`, without decoding its pixels.

    Decodes one row, the region's last, one iMCU wide, at the same scale: libjpeg
    entropy-decodes every row above it (where its corrupt-data warnings come from) and the
    bytes below are scanned as `decode_region` scans them. Costs the entropy decoding of the
    rows above the region's bottom, not their IDCT. For a backend that decodes elsewhere
    (pipelines/dali.py) and must refuse what the CPU pipeline refuses.
    """
    denom, (x0, _y0, _x1, y1), _ = scaled_region(box, size, image_size, scale)
    try:
        _lib().decode(raw, denom, x0, y1 - 1, x0 + 1, y1, 3)
    except ValueError as e:
        raise _decode_error(e) from None


def decode_region(raw, box, size: int | tuple[int, int], image_size: tuple[int, int], channels: int = 3,
                  scale: bool = True):
    """The low-level call: (pixels, width, height, box_in_region) or None when unsupported.

    `pixels` is a bytes object of height rows of width * channels (3: RGB, 4:
    RGBX) bytes; `box_in_region` is `box` in the returned pixels' coordinates
    (after DCT scaling; `scale=False`: never scaled). Raises DecodeError for
    corrupt or truncated data, also below the region (see the module's notes).
    """
    denom, (x0, y0, x1, y1), (left, top, w, h) = scaled_region(box, size, image_size, scale)
    try:
        got = _lib().decode(raw, denom, x0, y0, x1, y1, channels)
    except ValueError as e:
        raise _decode_error(e) from None
    if got is None:
        return None
    pixels, xoff, yoff, rw, rh, _sw, _sh = got
    return pixels, rw, rh, (left - xoff, top - yoff, w, h)


def decode_crop(raw, box, min_size: int, image_size: tuple[int, int] | None = None):
    """Decode the region of `raw` that resizing `box` (left, top, w, h) to min_size reads.

    Returns (HxWx3 uint8 array, (left, top, w, h) of the crop within it), or
    None when the JPEG's colour space is left to Pillow (CMYK, YCCK). Raises
    DecodeError on broken, corrupt or truncated data, with libjpeg's message.
    """
    if _jpegroi is None:
        return None
    if image_size is None:
        w, h, supported = header(raw)
        if not supported:
            return None
        image_size = (w, h)
    got = decode_region(raw, box, min_size, image_size, 3)
    if got is None:
        return None
    pixels, rw, rh, sub = got
    return np.frombuffer(pixels, dtype=np.uint8).reshape(rh, rw, 3), sub


def region_image(raw, box, size: int | tuple[int, int], image_size: tuple[int, int], scale: bool = True):
    """`decode_region` as a PIL image: (RGBX image over the decoded bytes, box in it) or None.

    RGBX because Pillow keeps RGB at 4 bytes a pixel: RGBX wraps the bytes
    without a copy (Image.frombuffer), RGB would unpack them (~0.1 ms).
    """
    got = decode_region(raw, box, size, image_size, 4, scale)
    if got is None:
        return None
    pixels, rw, rh, sub = got
    return Image.frombuffer("RGBX", (rw, rh), pixels, "raw", "RGBX", 0, 1), sub


def _decode_error(e: ValueError) -> DecodeError:
    hint = " (the file is truncated)" if str(e).startswith("Premature end of JPEG file") else ""
    return DecodeError(f"cannot decode image (JPEG): {e}{hint}")
