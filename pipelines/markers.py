"""A single-scan JPEG's entropy-coded data, checked for markers that cannot be there.

Pillow's full decode (`Image.load()`) fails with `broken data stream` when
corruption puts a marker libjpeg cannot parse inside the image data, and
ignores libjpeg's warnings otherwise. In the entropy-coded data of a file
with one scan only stuffed 0xFF 0x00 pairs, RSTn markers (with a restart
interval) and 0xFF fill bytes may follow a 0xFF, up to the EOI marker. `check` raises for any other marker
(a superset of what makes Pillow fail) and for a missing EOI, whatever rows a
crop needs: the Pillow path of pipelines/cpu.py runs it on every JPEG, so its
verdict does not depend on where a random crop falls, and rows.py's
stop-below-the-crop decode is as strict as Pillow's full decode.

The region decoder does the same scan in C over the bytes below its region
(pipelines/_jpegroi.c `roi_check_tail`); libjpeg's own warnings cover the
rows it decodes. Progressive and multi-scan files are left to libjpeg, which
reads every scan of them before the first row.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from coordl.errors import DecodeError

_SOS, _EOI, _DRI = 0xDA, 0xD9, 0xDD


def scan_data_start(raw) -> tuple[int, int, int] | None:
    """(offset of the first scan's entropy-coded data, components in that scan, restart interval).

    None when the header is broken (libjpeg reports that itself). Walks the
    marker segments from SOI, so that an SOS inside an APP segment (an EXIF
    thumbnail) is not taken for the image's.
    """
    i, n, restart = 2, len(raw), 0
    while i + 4 <= n:
        if raw[i] != 0xFF:
            return None
        code = raw[i + 1]
        if code == 0xFF:  # fill byte before a marker
            i += 1
            continue
        length = (raw[i + 2] << 8) | raw[i + 3]
        if code == _DRI and i + 6 <= n:
            restart = (raw[i + 4] << 8) | raw[i + 5]
        elif code == _SOS:
            return (i + 2 + length, raw[i + 4], restart) if i + 4 < n else None
        i += 2 + length
    return None


def check(raw, img: Image.Image) -> None:
    """DecodeError if the JPEG `img` (opened from `raw`) has a marker inside its image data or no EOI."""
    if img.info.get("progressive") or img.info.get("progression"):
        return
    check_scan(raw, getattr(img, "layers", 0))


def check_scan(raw, components: int) -> None:
    """`check` for a single-scan JPEG of `components` components, given without Pillow
    (pipelines/jpeghead.py reads the header itself)."""
    found = scan_data_start(raw)
    if found is None or found[1] != components:
        return  # a broken header (libjpeg says so), or a first scan without every component
    start, _components, restart = found
    data = np.frombuffer(raw, dtype=np.uint8)[start:]
    after = np.flatnonzero(data[:-1] == 0xFF) + 1
    codes = data[after]
    # markers proper: not a stuffed 0x00, not fill, not RSTn (0xD0..0xD7) where restarts are on
    proper = (codes != 0) & (codes != 0xFF)
    if restart:
        proper &= (codes < 0xD0) | (codes > 0xD7)
    marker = after[proper]
    if len(marker) == 0:
        raise DecodeError("cannot decode image (JPEG): Premature end of JPEG file: no end-of-image "
                          "marker after the image data (the file is truncated)")
    code = int(data[marker[0]])
    if code != _EOI:
        raise DecodeError(f"cannot decode image (JPEG): Corrupt JPEG data: marker 0x{code:02x} inside "
                          f"the image data, {len(data) - int(marker[0]) - 1} bytes before the end of the file")
