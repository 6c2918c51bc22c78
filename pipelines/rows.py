"""Decode only the top rows of a JPEG: the rows a crop needs, no further.

A baseline JPEG is one Huffman-coded stream read top to bottom, so the rows
below a crop's bottom edge need not be entropy-decoded, IDCT'd or colour
converted at all. RandomResizedCrop leaves on average about an eighth of a
500x375 photo below what its resize reads (measured on the bench dataset:
87% of the rows are decoded); this module stops libjpeg-turbo there, through
the same Pillow decoder that `Image.load()` drives (so the rows it returns
are bit-identical to a full decode's, with or without `Image.draft`).

libjpeg ends such a decode with "too few scanlines read", which Pillow
reports as a broken stream. To tell that expected ending from a real error,
the two ends of the last wanted row are pre-set to a sentinel colour: if the
decoder did not overwrite them, it did not reach that row, and the caller
falls back to a full `load()`, which raises Pillow's usual error (truncated
file, broken data), or decodes an image whose row really was that colour.

It drives Pillow's decoder directly (`Image._getdecoder`, `ImagingCore`),
the way `ImageFile.load()` does; `can_stop_early` is False where Pillow
lacks `_getdecoder`, and the caller then does a plain `load()`.

Corrupt data is not left to the sentinel alone. A broken header or
progressive scan stops the decoder before the last wanted row, so the
sentinel sends it to `load()`, which raises. Corrupt image data, in the rows
decoded or below them, Pillow's full decode rejects only where it makes a
marker libjpeg cannot parse; before any decode pipelines/cpu.py runs
`markers.check`, which rejects every marker inside the image data and a file
without EOI, wherever the crop is. What that lets through, a byte changed
without making a marker, Pillow's full decode passes too (libjpeg only
warns), and below the crop it changes no row returned here.
"""

from __future__ import annotations

import math

from PIL import Image

_SENTINEL = (1, 254, 3)
_EOI = b"\xff\xd9"


def can_stop_early(img: Image.Image) -> bool:
    """Whether `top_rows` may be used on this (lazily opened) image."""
    tile = getattr(img, "tile", ())  # an ImageFile's decoder plan (not on a plain Image)
    return (img.format == "JPEG" and img.mode == "RGB" and len(tile) == 1
            and tile[0][0] == "jpeg" and hasattr(Image, "_getdecoder"))


def rows_for_box(box: tuple[float, float, float, float], out_height: int) -> int:
    """How many top rows a bilinear, antialiased resize of `box` to `out_height` reads.

    Pillow's resampler reads `support = max(h / out_height, 1)` rows past the
    box (plus half a pixel of rounding), so that many more rows keep the
    result bit-identical to resizing the fully decoded image.
    """
    _left, top, _w, h = box
    return math.ceil(top + h + max(h / out_height, 1.0) + 0.5) + 1


def top_rows(img: Image.Image, raw, rows: int) -> Image.Image | None:
    """The top `rows` rows of `img` (opened from `raw`, maybe drafted) as an RGB image.

    Returns None when it cannot be done here (the caller then does a full
    `load()`): the file does not end with EOI, the rows reach the bottom
    anyway, or the decoder stopped before the last wanted row.
    """
    width, height = img.size
    if rows >= height or bytes(raw[-2:]) != _EOI:
        return None
    name, _extent, offset, args = getattr(img, "tile")[0]  # noqa: B009 (can_stop_early: an ImageFile)
    decoder = Image._getdecoder(img.mode, name, args, getattr(img, "decoderconfig", ()))
    core = Image.core.new("RGB", (width, rows))
    for x in (0, width - 1):  # only the last row's ends: filling it all costs a full pass
        core.putpixel((x, rows - 1), _SENTINEL)
    try:
        decoder.setimage(core, (0, 0, width, rows))
        data = memoryview(raw)[offset:]
        consumed, err = decoder.decode(data)  # pyright: ignore[reportArgumentType] (a memoryview works)
        while err == 0 and 0 < consumed < len(data):   # a suspending decoder may want more calls
            data = data[consumed:]
            consumed, err = decoder.decode(data)  # pyright: ignore[reportArgumentType] (a memoryview works)
    finally:
        decoder.cleanup()
    if err == 0:  # asked for more data than the file has: truncated
        return None
    last = width - 1, rows - 1
    if core.getpixel(last) == _SENTINEL and core.getpixel((0, rows - 1)) == _SENTINEL:
        return None
    return img._new(core)
