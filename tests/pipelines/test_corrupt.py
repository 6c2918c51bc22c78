"""Real corruptions of real JPEGs, against Pillow's verdict on the same bytes.

For every corrupted file: when Pillow's full decode (`Image.open(...).load()`)
raises or warns, coordl's `train` (many crops) and `val` raise DecodeError, a
SampleError, on the region decoder's path and on the Pillow path alike. When
Pillow decodes it, coordl either raises too (it may be stricter) or gives
Pillow's pixels: it never silently differs.

Corruptions: bits flipped in the entropy-coded segment at several offsets, a
marker written into it, a run of random bytes, truncation, a bad Huffman
table; on baseline, large, restart-interval, progressive and greyscale files.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from PIL import Image

from coordl.errors import DecodeError, SampleError
from coordl.pipelines import cpu, crop, markers, roi

SIZE = 224
#: random crops per corrupted file; a progressive file is decoded whole whatever the crop
CROPS = {"baseline": 6, "large": 4, "restarts": 6, "progressive": 2, "gray": 4}
BILINEAR = Image.Resampling.BILINEAR


def _reencode(raw: bytes, **kw) -> bytes:
    img = Image.open(io.BytesIO(raw))
    if kw.pop("gray", False):
        img = img.convert("L")
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def originals(bench_sample) -> dict[str, bytes]:
    small = bench_sample[0]
    large = next(r for r in bench_sample if Image.open(io.BytesIO(r)).size == (1500, 1125))
    return {
        "baseline": small,
        "large": large,
        "restarts": _reencode(small, restart_marker_rows=1),
        "progressive": _reencode(small, progressive=True),
        "gray": _reencode(small, gray=True),
    }


def corruptions(raw: bytes, seed: int = 0) -> dict[str, bytes]:
    """Named corrupted copies of `raw`."""
    start = markers.scan_data_start(raw)[0]
    end = len(raw) - 2
    rng = np.random.default_rng(seed)
    out = {}

    def at(frac: float) -> int:
        k = start + int((end - start - 2) * frac)
        while raw[k - 1] == 0xFF or raw[k] == 0xFF:  # keep the edit off a stuffed pair or marker
            k += 1
        return k

    for frac, bit in ((0.01, 0x01), (0.25, 0x80), (0.5, 0x01), (0.75, 0x10), (0.99, 0x80)):
        b = bytearray(raw)
        k = at(frac)
        b[k] ^= bit if raw[k] ^ bit != 0xFF else bit >> 1
        out[f"flip {bit:#04x} at {frac}"] = bytes(b)
    for frac in (0.01, 0.5, 0.99):
        for code in (0x01, 0xC4, 0xD3, 0xD9, 0xDA, 0xE1):
            b = bytearray(raw)
            k = at(frac)
            b[k], b[k + 1] = 0xFF, code
            out[f"marker {code:#04x} at {frac}"] = bytes(b)
    for frac in (0.3, 0.9):
        b = bytearray(raw)
        k = at(frac)
        b[k:k + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        out[f"64 random bytes at {frac}"] = bytes(b)
    for frac in (0.05, 0.6, 0.9995):
        out[f"truncated at {frac}"] = raw[: start + int((end - start) * frac)]
    dht = raw.index(b"\xff\xc4")
    b = bytearray(raw)
    b[dht + 5] = 3  # three 1-bit codes: more codes than a 1-bit length holds
    out["Huffman table: too many short codes"] = bytes(b)
    b = bytearray(raw)
    b[dht + 5 + 16 - 1] = 200  # 200 more 16-bit codes: more symbols than the segment holds
    out["Huffman table: counts past the segment"] = bytes(b)
    b = bytearray(raw)
    nsym = sum(raw[dht + 5:dht + 21])
    b[dht + 21:dht + 21 + nsym] = bytes(reversed(raw[dht + 21:dht + 21 + nsym]))
    out["Huffman table: symbols reversed"] = bytes(b)
    return out


def pillow_verdict(raw: bytes) -> str | None:
    """None when Pillow's full decode takes the bytes without an error or a warning, else why not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            Image.open(io.BytesIO(raw)).load()
        except Exception as e:  # noqa: BLE001 - any failure is Pillow's "no"
            return f"{type(e).__name__}: {e}"
    return f"warning: {caught[0].message}" if caught else None


class PillowReference:
    """Pillow's full decode of one file, at each DCT scale asked (cached), cropped as cpu.train/val do."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.decoded = raw, {}

    def _resize(self, box, flip: bool = False) -> np.ndarray:
        img = Image.open(io.BytesIO(self.raw))
        denom = crop.scale_denom(box, SIZE, img.size)
        left, top, w, h = cpu._draft(img, box, SIZE)
        if denom not in self.decoded:
            self.decoded[denom] = img.convert("RGB")
        small = self.decoded[denom].resize((SIZE, SIZE), BILINEAR, box=(left, top, left + w, top + h))
        return np.asarray(small.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else small)

    def train(self, rng) -> np.ndarray:
        size = Image.open(io.BytesIO(self.raw)).size
        box = crop.random_resized_crop_box(*size, rng)
        return self._resize(box, crop.flip(rng))

    def val(self) -> np.ndarray:
        return self._resize(crop.center_crop_box(*Image.open(io.BytesIO(self.raw)).size, SIZE))


def _coordl_runs(raw: bytes, use_roi: bool, crops: int):
    """(what, coordl's output or its DecodeError, Pillow's output for it, lazily) for each crop and val."""
    ref = PillowReference(raw)
    for epoch in range(crops):
        try:
            got = cpu.train(raw, SIZE, crop.item_rng(0, epoch, 0), roi=use_roi)
        except SampleError as e:
            got = e
        yield f"train epoch {epoch}", got, lambda e=epoch: ref.train(crop.item_rng(0, e, 0))
    try:
        got = cpu.val(raw, SIZE, roi=use_roi)
    except SampleError as e:
        got = e
    yield "val", got, ref.val


@pytest.mark.parametrize("path", ["roi", "pillow"])
@pytest.mark.parametrize("kind", ["baseline", "large", "restarts", "progressive", "gray"])
def test_coordl_is_at_least_as_strict_as_pillow(originals, kind, path):
    if path == "roi" and not roi.AVAILABLE:
        pytest.skip("the _jpegroi extension is not built")
    rejected = accepted_same = 0
    for name, raw in corruptions(originals[kind]).items():
        verdict = pillow_verdict(raw)
        for what, got, pillow in _coordl_runs(raw, path == "roi", CROPS[kind]):
            if verdict is not None:
                assert isinstance(got, DecodeError), (
                    f"{kind}, {name}: Pillow says {verdict!r}, coordl's {what} ({path}) decoded it")
                rejected += 1
            elif not isinstance(got, DecodeError):
                diff = np.abs(got.astype(int) - pillow()).max()
                assert diff <= 1, f"{kind}, {name}: coordl's {what} ({path}) differs from Pillow's by {diff}"
                accepted_same += 1
    # the set holds both kinds, so that neither branch is vacuous
    runs = CROPS[kind] + 1
    assert rejected >= 9 * runs and accepted_same >= 3 * runs, (rejected, accepted_same)


def test_the_uncorrupted_files_pass(originals):
    for kind, raw in originals.items():
        assert pillow_verdict(raw) is None
        markers.check(raw, Image.open(io.BytesIO(raw)))
        for use_roi in (True, False):
            cpu.val(raw, SIZE, roi=use_roi)
            for epoch in range(CROPS[kind]):
                cpu.train(raw, SIZE, crop.item_rng(0, epoch, 0), roi=use_roi)


def test_the_verdict_does_not_depend_on_the_crop(originals):
    """A marker where none belongs raises for every crop, also those far above it (issue 10).

    Not EOI (the image data ends there: the rows above it are right), nor RSTn in a file
    with restart markers (image data there).
    """
    for kind in ("baseline", "large", "restarts"):
        for name, raw in corruptions(originals[kind]).items():
            if not name.startswith("marker") or "0xd9" in name or (kind == "restarts" and "0xd3" in name):
                continue
            for use_roi in (True, False):
                for epoch in range(CROPS[kind]):
                    with pytest.raises(DecodeError, match="Corrupt JPEG data"):
                        cpu.train(raw, SIZE, crop.item_rng(0, epoch, 0), roi=use_roi)


def test_an_sos_inside_an_app_segment_is_not_the_scan(originals):
    raw = originals["baseline"]
    body = b"thumbnail \xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00 \xff\x01 more"
    app1 = b"\xff\xe1" + (len(body) + 2).to_bytes(2, "big") + body
    tagged = raw[:2] + app1 + raw[2:]
    assert markers.scan_data_start(tagged)[0] == markers.scan_data_start(raw)[0] + len(app1)
    assert pillow_verdict(tagged) is None
    markers.check(tagged, Image.open(io.BytesIO(tagged)))
    np.testing.assert_array_equal(cpu.val(tagged, SIZE), cpu.val(raw, SIZE))
