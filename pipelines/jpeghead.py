"""A JPEG's header, read in pure Python: size, coding and colour, and whether a GPU decoder takes it.

The batch path (pipelines/batchprep.py) reads this in the loader's worker processes, next to
the bytes, so that the training process gets each image's size (the crop boxes are drawn from
it, as the CPU pipeline draws them) and knows up front which images to give the CPU decoder:
hardware and nvJPEG decoders take baseline and extended sequential Huffman JPEGs with one
(grey) or three (YCbCr) components in the usual chroma subsamplings; progressive, lossless and
arithmetic-coded files, CMYK/YCCK (four components, or an Adobe transform flag on three) and
odd subsamplings go to the CPU (`device_ok` says which).

`check` is the strictness the CPU pipeline gives a file it does not decode all of
(pipelines/markers.py): a marker inside the image data, no image data, or no end-of-image
marker is a `DecodeError`, never a picture of the bytes that are there. What it cannot see
without entropy-decoding (corrupt Huffman data, a file cut mid-scan with an end marker
appended) is left to the decoder: coordl's CPU decoder and nvImageCodec's refusals raise, but
GPU decoders only warn on some corrupt data, as Pillow's full decode does.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordl.errors import DecodeError

from . import markers

_SOI = b"\xff\xd8"
_SOF_SEQUENTIAL = (0xC0, 0xC1)             # baseline, extended sequential (Huffman)
_SOF_PROGRESSIVE = 0xC2
_SOF_ALL = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # every SOFn (C4 DHT, C8 JPG, CC DAC are not)
_APP14 = 0xEE
#: luma (h, v) sampling factors of a 3-component file whose chroma is (1, 1) that GPU decoders take:
#: 4:4:4, 4:2:2, 4:4:0, 4:2:0, 4:1:1, 4:1:0
_SUBSAMPLINGS = frozenset({(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (4, 2)})


@dataclass(frozen=True)
class JpegHeader:
    width: int
    height: int
    components: int     # 1 grey, 3 YCbCr (or RGB with an Adobe flag), 4 CMYK/YCCK
    sof: int            # the SOFn marker's code: 0xC0 baseline, 0xC2 progressive...
    sampling: tuple     # (h, v) sampling factors of each component
    adobe_transform: int | None  # the APP14 "Adobe" segment's transform flag, when there is one

    @property
    def progressive(self) -> bool:
        return self.sof == _SOF_PROGRESSIVE

    @property
    def device_ok(self) -> bool:
        """Do GPU JPEG decoders (nvImageCodec, nvJPEG) take this file? Else it goes to the CPU."""
        if self.sof not in _SOF_SEQUENTIAL:
            return False
        if self.components == 1:
            return True
        if self.components != 3 or self.adobe_transform == 0:  # transform 0 on 3 components: RGB, not YCbCr
            return False
        luma, *chroma = self.sampling
        return tuple(luma) in _SUBSAMPLINGS and all(tuple(c) == (1, 1) for c in chroma)

    @property
    def reason(self) -> str:
        """Why a GPU decoder does not take it ('' when it does)."""
        if self.device_ok:
            return ""
        if self.progressive:
            return "progressive"
        if self.sof not in _SOF_SEQUENTIAL:
            return f"coding SOF 0x{self.sof:02x}"
        if self.components != 3 or self.adobe_transform == 0:
            return f"{self.components} components" + (" (CMYK/YCCK)" if self.components == 4 else "")
        return f"chroma subsampling {self.sampling}"


def is_jpeg(raw) -> bool:
    return bytes(raw[:2]) == _SOI


def read(raw) -> JpegHeader:
    """The header of the JPEG `raw`; DecodeError when it is not a JPEG or its header is broken."""
    if not is_jpeg(raw):
        raise DecodeError(f"not a JPEG (starts with {bytes(raw[:8])!r})")
    i, n, adobe = 2, len(raw), None
    while i + 4 <= n:
        if raw[i] != 0xFF:
            raise DecodeError(f"cannot decode image (JPEG): broken header (no marker at byte {i})")
        code = raw[i + 1]
        if code == 0xFF:  # fill byte before a marker
            i += 1
            continue
        length = (raw[i + 2] << 8) | raw[i + 3]
        if length < 2 or i + 2 + length > n:
            break
        if code == _APP14 and length >= 14 and bytes(raw[i + 4:i + 9]) == b"Adobe":
            adobe = raw[i + 15] if length >= 14 else None
        elif code in _SOF_ALL:
            return _frame(raw, i, length, code, adobe)
        elif code == 0xDA:
            break  # a scan before any frame header
        i += 2 + length
    raise DecodeError("cannot decode image (JPEG): no frame header (SOF) before the image data: "
                      "the file is truncated or not a JPEG")


def _frame(raw, i: int, length: int, code: int, adobe: int | None) -> JpegHeader:
    height = (raw[i + 5] << 8) | raw[i + 6]
    width = (raw[i + 7] << 8) | raw[i + 8]
    components = raw[i + 9]
    if width == 0 or height == 0 or components == 0 or length < 8 + 3 * components:
        raise DecodeError(f"cannot decode image (JPEG): bad frame header ({width}x{height}, "
                          f"{components} components)")
    sampling = tuple((raw[i + 11 + 3 * c] >> 4, raw[i + 11 + 3 * c] & 15) for c in range(components))
    return JpegHeader(width, height, components, code, sampling, adobe)


def check(raw, head: JpegHeader) -> None:
    """DecodeError for a single-scan JPEG with a marker inside its image data or no end-of-image
    marker (pipelines/markers.py); progressive files are left to their decoder."""
    if head.progressive or head.sof not in _SOF_SEQUENTIAL:
        return
    found = markers.scan_data_start(raw)
    if found is not None and bytes(raw[found[0]:found[0] + 2]) == b"\xff\xd9":
        raise DecodeError("cannot decode image (JPEG): no image data: the end-of-image marker follows "
                          "the scan header (the file is truncated)")
    markers.check_scan(raw, head.components)
