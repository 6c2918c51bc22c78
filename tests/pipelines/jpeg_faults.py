"""Broken and mislabelled image files made from a good JPEG, for the tests that compare backends.

The three JPEGs DALI used to decode into a picture where the CPU backend refuses them
(issue 24), and files of other formats under a .jpg name. Test modules import this with
their folder on sys.path (tests use --import-mode=importlib).
"""

from __future__ import annotations

import io
import os
import random

from PIL import Image

from coordl.pipelines import markers


def _in_scan(raw: bytes, frac: float) -> int:
    """An offset `frac` of the way through the scan data, off any 0xFF pair."""
    start = markers.scan_data_start(raw)[0]
    k = start + int((len(raw) - 2 - start) * frac)
    while raw[k - 1] == 0xFF or raw[k] == 0xFF:
        k += 1
    return k


def cut_with_eoi(raw: bytes, frac: float = 0.6) -> bytes:
    """The file cut `frac` of the way through its scan, then FF D9: an end marker where data should be."""
    return raw[:_in_scan(raw, frac)] + b"\xff\xd9"


def stray_rst(raw: bytes, frac: float = 0.5) -> bytes:
    """FF D3 (a restart marker) inserted mid-scan in a file without a restart interval."""
    k = _in_scan(raw, frac)
    return raw[:k] + b"\xff\xd3" + raw[k:]


def header_only(raw: bytes) -> bytes:
    """The headers up to the scan, then FF D9: no image data at all (libjpeg fills it grey)."""
    return raw[:markers.scan_data_start(raw)[0]] + b"\xff\xd9"


#: name -> maker of a JPEG both backends must refuse
CORRUPT = {"cut at 60% + EOI": cut_with_eoi, "stray RST mid-scan": stray_rst, "header + EOI only": header_only}


def reencoded(raw: bytes, fmt: str) -> bytes:
    """The image of `raw` saved by Pillow as `fmt` (PNG, GIF, BMP, TIFF)."""
    buf = io.BytesIO()
    Image.open(io.BytesIO(raw)).save(buf, fmt)
    return buf.getvalue()


def random_bytes(n: int = 4000, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


#: name -> maker of a file in another format than its .jpg name says
OTHER_FORMATS = {
    "PNG": lambda raw: reencoded(raw, "PNG"),
    "GIF": lambda raw: reencoded(raw, "GIF"),
    "BMP": lambda raw: reencoded(raw, "BMP"),
    "TIFF": lambda raw: reencoded(raw, "TIFF"),
    "PNG cut short": lambda raw: reencoded(raw, "PNG")[:len(reencoded(raw, "PNG")) // 2],
    "random bytes": lambda raw: random_bytes(),
}


def add_faults(root: str) -> dict[str, str]:
    """Write every fault above into the classes of the dataset at `root` (named *.jpg, made from
    the first file of a class); returns file name -> fault."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    made = {}
    faults = [(f"corrupt {n}", m) for n, m in CORRUPT.items()] + [(f"a {n} file", m) for n, m in OTHER_FORMATS.items()]
    for k, (what, maker) in enumerate(faults):
        folder = os.path.join(root, classes[k % len(classes)])
        with open(os.path.join(folder, sorted(os.listdir(folder))[0]), "rb") as f:
            good = f.read()
        name = f"fault{k}.jpg"
        with open(os.path.join(folder, name), "wb") as f:
            f.write(maker(good))
        made[name] = what
    return made
