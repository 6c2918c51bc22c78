"""The region-of-interest JPEG decoder (pipelines/_jpegroi.c, pipelines/roi.py) against Pillow.

- Every pixel of a decoded region but its first and last column (libjpeg-turbo's
  cropped upsampling treats them as image edges) equals Pillow's full decode of
  the same file at the same DCT scale: any subsampling, progressive, grayscale.
- Resizing the region (box, resampler margin) gives exactly the pixels of
  resizing Pillow's full decode; with DCT scaling, PSNR >= 35 dB against a full
  decode + resize.
- Broken, truncated and corrupt files raise DecodeError (coordl/errors.py); CMYK is left to
  Pillow. tests/pipelines/test_corrupt.py checks a set of corruptions against Pillow's verdict.
"""

from __future__ import annotations

import gc
import io
import math
import os
import shutil
import sysconfig

import numpy as np
import pytest
from PIL import Image

from coordl.errors import DecodeError
from coordl.pipelines import cpu, crop, roi

SIZE = 224
BILINEAR = Image.Resampling.BILINEAR
needs_roi = pytest.mark.skipif(not roi.AVAILABLE, reason="the _jpegroi extension is not built")


def _photo(w: int, h: int, seed: int = 0) -> np.ndarray:
    """Smooth colour fields plus noise: chroma that varies, so upsampling matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([127 + 100 * np.sin(x / (7 + 13 * k) + y / (11 + 5 * k) + k) for k in range(3)], axis=2)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def _jpeg(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    img = Image.fromarray(arr)
    if kw.pop("gray", False):
        img = img.convert("L")
    if kw.pop("cmyk", False):
        img = img.convert("CMYK")
    img.save(buf, "JPEG", quality=kw.pop("quality", 90), **kw)
    return buf.getvalue()


def _pillow(raw: bytes, denom: int = 1) -> np.ndarray:
    img = Image.open(io.BytesIO(raw))
    if denom > 1:
        img.draft("RGB", (img.size[0] // denom, img.size[1] // denom))
    return np.asarray(img.convert("RGB"))


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


VARIANTS = {
    "420": {},
    "444": {"subsampling": 0},
    "422": {"subsampling": 1},
    "progressive": {"progressive": True},
    "gray": {"gray": True},
    "odd-size": {"_size": (333, 257)},
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request):
    kw = dict(VARIANTS[request.param])
    w, h = kw.pop("_size", (500, 375))
    return request.param, _jpeg(_photo(w, h, seed=len(request.param)), **kw)


def test_built_when_it_can_be():
    """install.sh builds the extension; a silent build failure would only make coordl slower."""
    can_build = (os.path.exists("/usr/include/jpeglib.h") and shutil.which("cc")
                 and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
    if not can_build:
        pytest.skip("no compiler, jpeglib.h or Python.h here")
    assert roi.AVAILABLE, "jpeglib.h and a compiler are here but coordl.pipelines._jpegroi is not built"


@needs_roi
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_region_pixels_equal_pillow_full_decode(variant, denom):
    name, raw = variant
    full = _pillow(raw, denom)
    height, width = full.shape[:2]
    rng = np.random.default_rng(denom)
    for _ in range(25):
        x0 = int(rng.integers(0, width - 1))
        x1 = int(rng.integers(x0 + 1, width + 1))
        y0 = int(rng.integers(0, height - 1))
        y1 = int(rng.integers(y0 + 1, height + 1))
        pixels, xoff, yoff, w, h, sw, sh = roi._jpegroi.decode(raw, denom, x0, y0, x1, y1, 3)
        assert (sw, sh) == (width, height)
        assert yoff == y0 and h == y1 - y0 and xoff <= x0 and xoff + w >= x1
        got = np.frombuffer(pixels, np.uint8).reshape(h, w, 3)
        ref = full[yoff:yoff + h, xoff:xoff + w]
        lo = 1 if xoff > 0 else 0  # the cropped row's edge columns: see roi.EDGE
        hi = w - 1 if xoff + w < width else w
        np.testing.assert_array_equal(got[:, lo:hi], ref[:, lo:hi], err_msg=f"{name} {(x0, y0, x1, y1)}")
        rgbx = roi._jpegroi.decode(raw, denom, x0, y0, x1, y1, 4)[0]
        np.testing.assert_array_equal(np.frombuffer(rgbx, np.uint8).reshape(h, w, 4)[..., :3], got)


def _resize_full(raw: bytes, box, flip: bool = False) -> np.ndarray:
    left, top, w, h = box
    img = Image.open(io.BytesIO(raw)).convert("RGB")
    return np.asarray(img.resize((SIZE, SIZE), BILINEAR, box=(left, top, left + w, top + h)))


def _resize_region(arr: np.ndarray, box) -> np.ndarray:
    left, top, w, h = box
    img = Image.fromarray(np.ascontiguousarray(arr))
    return np.asarray(img.resize((SIZE, SIZE), BILINEAR, box=(left, top, left + w, top + h)))


@needs_roi
def test_resized_crop_is_bit_identical_without_scaling(variant):
    """Random crops (scale 1 on 500x375) and val's fractional box: same pixels as a full decode."""
    _name, raw = variant
    width, height = Image.open(io.BytesIO(raw)).size
    boxes = [crop.random_resized_crop_box(width, height, crop.item_rng(0, 0, i)) for i in range(30)]
    boxes += [(0, 0, width, height), (0, 0, 50, 40), (width - 61, height - 47, 61, 47),
              (width - 1, height - 1, 1, 1), (0, height - 30, width, 30)]
    boxes.append(crop.center_crop_box(width, height, SIZE))
    for box in boxes:
        got = roi.decode_crop(raw, box, SIZE)
        assert got is not None
        arr, sub = got
        assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3
        if crop.scale_denom(box, SIZE, (width, height)) != 1:
            continue
        diff = np.abs(_resize_region(arr, sub).astype(int) - _resize_full(raw, box)).max()
        # integer boxes are exact; val's fractional box, shifted by the region's offset, may
        # round the resampler's weights differently in the last bit
        assert diff <= (0 if all(float(v).is_integer() for v in box) else 1), box


@needs_roi
def test_dct_scaled_crop_psnr_against_full_decode():
    raw = _jpeg(_photo(1500, 1125, seed=3))
    scaled = 0
    for i in range(40):
        box = crop.random_resized_crop_box(1500, 1125, crop.item_rng(2, 0, i))
        denom = crop.scale_denom(box, SIZE, (1500, 1125))
        scaled += denom > 1
        arr, sub = roi.decode_crop(raw, box, SIZE)
        assert _psnr(_resize_region(arr, sub), _resize_full(raw, box)) >= 35.0, (box, denom)
    assert scaled > 10


def test_scale_matches_pillow_draft():
    """Pillow's draft, asked as cpu._draft asks it, scales by exactly crop.scale_denom: the one rule."""
    denoms = set()
    for wh in ((500, 375), (1500, 1125), (4000, 3000), (1125, 1500), (900, 300), (2001, 17)):
        raw = _jpeg(np.zeros((wh[1], wh[0], 3), np.uint8))
        for i in range(50):
            box = crop.random_resized_crop_box(*wh, crop.item_rng(3, 0, i))
            img = cpu.open_image(raw)
            cpu._draft(img, box, SIZE)
            denom = crop.scale_denom(box, SIZE, wh)
            denoms.add(denom)
            assert img.size == (-(-wh[0] // denom), -(-wh[1] // denom)), (wh, box)
            assert min(box[2], box[3]) / denom >= SIZE * crop.DRAFT_MARGIN or denom == 1, (wh, box)
    assert denoms == {1, 2, 4, 8}


@needs_roi
@pytest.mark.parametrize("wh", [(1, 1), (2, 3), (9, 9), (17, 5), (16, 16)])
def test_tiny_images(wh):
    raw = _jpeg(_photo(*wh))
    box = crop.random_resized_crop_box(*wh, crop.item_rng(0, 0, 0))
    arr, sub = roi.decode_crop(raw, box, SIZE)
    np.testing.assert_array_equal(_resize_region(arr, sub), _resize_full(raw, box))


@needs_roi
def test_memoryview_and_bytearray_inputs():
    raw = _jpeg(_photo(64, 48))
    box = (3, 5, 40, 30)
    a = roi.decode_crop(raw, box, SIZE)[0]
    np.testing.assert_array_equal(roi.decode_crop(memoryview(raw), box, SIZE)[0], a)
    np.testing.assert_array_equal(roi.decode_crop(bytearray(raw), box, SIZE)[0], a)


@needs_roi
def test_cmyk_is_left_to_pillow():
    raw = _jpeg(_photo(64, 48), cmyk=True)
    assert roi.header(raw)[2] is False
    assert roi.decode_crop(raw, (0, 0, 64, 48), SIZE) is None
    assert roi._jpegroi.decode(raw, 1, 0, 0, 64, 48, 3) is None


@needs_roi
@pytest.mark.parametrize("cut", [0.3, 0.7, 0.98])
def test_truncated_raises(cut):
    raw = _jpeg(_photo(500, 375))
    bad = raw[: int(len(raw) * cut)]
    with pytest.raises(OSError):  # Pillow agrees that it is broken
        Image.open(io.BytesIO(bad)).load()
    for box in ((0, 0, 500, 375), (10, 0, 100, 40), (300, 250, 200, 125)):
        with pytest.raises(DecodeError, match="JPEG"):
            roi.decode_crop(bad, box, SIZE)


@needs_roi
def test_corrupt_entropy_data_raises():
    raw = bytearray(_jpeg(_photo(500, 375)))
    sos = raw.index(b"\xff\xda")
    for k in range(sos + 200, sos + 260):
        raw[k] = 0xFF if k % 2 else 0xD3  # restart markers where none belong
    with pytest.raises(DecodeError, match="Corrupt JPEG data|JPEG"):
        roi.decode_crop(bytes(raw), (0, 0, 500, 375), SIZE)


@needs_roi
@pytest.mark.parametrize("raw", [b"", b"\xff\xd8\xff", b"not a jpeg at all", b"\xff\xd8\xff\xe0" + b"\x00" * 50])
def test_not_a_jpeg_raises(raw):
    with pytest.raises(DecodeError):
        roi.decode_crop(raw, (0, 0, 10, 10), SIZE)


@needs_roi
def test_error_paths_do_not_leak():
    psutil = pytest.importorskip("psutil")
    raw = _jpeg(_photo(500, 375))
    bad = raw[: len(raw) // 2]
    proc = psutil.Process()

    def burst():
        for _ in range(300):
            with pytest.raises(DecodeError):
                roi.decode_crop(bad, (0, 0, 500, 375), SIZE)
            roi.decode_crop(raw, (20, 30, 200, 150), SIZE)
        gc.collect()

    burst()
    before = proc.memory_info().rss
    for _ in range(4):
        burst()
    grown = proc.memory_info().rss - before
    # a leaked decoder (~100 KiB of libjpeg state and buffers) per error would be > 100 MiB here
    assert grown < 8 << 20, f"RSS grew by {grown >> 10} KiB over 1200 failed decodes"


@needs_roi
def test_threads_decode_concurrently_with_the_same_result():
    from concurrent.futures import ThreadPoolExecutor

    raw = _jpeg(_photo(500, 375))
    boxes = [crop.random_resized_crop_box(500, 375, crop.item_rng(4, 0, i)) for i in range(32)]
    serial = [roi.decode_crop(raw, b, SIZE)[0] for b in boxes]
    with ThreadPoolExecutor(4) as ex:
        threaded = list(ex.map(lambda b: roi.decode_crop(raw, b, SIZE)[0], boxes))
    for a, b in zip(serial, threaded):
        np.testing.assert_array_equal(a, b)


# --- cpu.train / cpu.val with the ROI decoder -------------------------------------------------


@needs_roi
def test_train_and_val_match_the_pillow_path(bench_sample):
    """Same pixels as without the ROI decoder, up to 1 on a few values: the region's offset
    rounds the resampler's weights differently in the last bit for fractional (scaled, val) boxes."""
    stats = {"train": [0, 0], "train, no draft": [0, 0], "val": [0, 0]}
    for epoch in range(2):
        for i, raw in enumerate(bench_sample):
            pairs = {name: (cpu.train(raw, SIZE, crop.item_rng(epoch, 0, i), draft=draft),
                            cpu.train(raw, SIZE, crop.item_rng(epoch, 0, i), draft=draft, roi=False))
                     for name, draft in (("train", True), ("train, no draft", False))}
            pairs["val"] = cpu.val(raw, SIZE), cpu.val(raw, SIZE, roi=False)
            for name, (a, b) in pairs.items():
                d = np.abs(a.astype(int) - b)
                assert d.max() <= 1, f"{name}, item {i}"
                stats[name][0] += int((d > 0).sum())
                stats[name][1] += d.size
    assert stats["train, no draft"][0] == 0  # integer boxes, no scaling: bit-identical
    assert stats["train"][0] / stats["train"][1] < 1e-4, stats
    assert stats["val"][0] / stats["val"][1] < 5e-3, stats


@needs_roi
def test_train_and_val_use_the_roi_decoder(monkeypatch, bench_sample):
    calls = []
    real = roi.region_image
    monkeypatch.setattr(roi, "region_image", lambda *a, **k: calls.append(1) or real(*a, **k))
    cpu.train(bench_sample[0], SIZE, crop.item_rng(0, 0, 0))
    cpu.val(bench_sample[0], SIZE)
    assert len(calls) == 2
    cpu.train(bench_sample[0], SIZE, crop.item_rng(0, 0, 0), roi=False)
    cpu.train(bench_sample[0], SIZE, crop.item_rng(0, 0, 0), partial=False)  # the full-decode reference
    assert len(calls) == 2


def test_without_the_extension_jpegs_take_the_pillow_path(monkeypatch, bench_sample):
    want = cpu.train(bench_sample[1], SIZE, crop.item_rng(0, 0, 1), roi=False)
    monkeypatch.setattr(roi, "AVAILABLE", False)
    np.testing.assert_array_equal(cpu.train(bench_sample[1], SIZE, crop.item_rng(0, 0, 1)), want)


@needs_roi
def test_what_the_roi_decoder_refuses_goes_to_pillow():
    cmyk = _jpeg(_photo(300, 200), cmyk=True)
    np.testing.assert_array_equal(cpu.train(cmyk, SIZE, crop.item_rng(0, 0, 0)),
                                  cpu.train(cmyk, SIZE, crop.item_rng(0, 0, 0), roi=False))
    gray = _jpeg(_photo(300, 200), gray=True)
    assert np.abs(cpu.train(gray, SIZE, crop.item_rng(0, 0, 0)).astype(int)
                  - cpu.train(gray, SIZE, crop.item_rng(0, 0, 0), roi=False)).max() <= 1


@needs_roi
def test_what_the_roi_decoder_fails_on_raises(bench_sample):
    """No second chance with Pillow: corrupt data inside the region raises, whatever Pillow makes of it."""
    raw = bytearray(bench_sample[0])
    sos = raw.index(b"\xff\xda")
    for k in range(sos + 200, sos + 260):
        raw[k] = 0xFF if k % 2 else 0xD3  # restart markers where none belong
    raw = bytes(raw)
    for epoch in range(6):
        with pytest.raises(DecodeError, match="Corrupt JPEG data"):
            cpu.train(raw, SIZE, crop.item_rng(0, epoch, 0))
    with pytest.raises(DecodeError, match="Corrupt JPEG data"):
        cpu.val(raw, SIZE)
    # truncated: says so, whatever the crop
    cut = bench_sample[0][: len(bench_sample[0]) // 2]
    for epoch in range(6):
        with pytest.raises(DecodeError, match="truncated"):
            cpu.train(cut, SIZE, crop.item_rng(0, epoch, 0))


@needs_roi
@pytest.mark.parametrize("code", [0xC4, 0xD9, 0xE1, 0x01])
def test_a_marker_below_the_region_raises(code):
    """The rows below the region are never decoded, but their bytes are scanned."""
    raw = bytearray(_jpeg(_photo(500, 375)))
    k = len(raw) - 300  # in the last rows' data
    raw[k - 1:k + 1] = b"\x00\xff"  # never a stuffed 0xFF before it
    raw[k + 1] = code
    raw = bytes(raw)
    if code == 0xD9:  # an early EOI ends the image data: the rows above it are right
        top = roi.decode_crop(raw, (0, 0, 100, 40), SIZE)[0]
        np.testing.assert_array_equal(top[:, 1:-1], _pillow(raw)[:top.shape[0], 1:top.shape[1] - 1])
        return
    with pytest.raises(DecodeError, match=f"marker 0x{code:02x} inside the image data"):
        roi.decode_crop(raw, (0, 0, 100, 40), SIZE)


@needs_roi
def test_restart_markers_and_fill_bytes_are_image_data():
    arr = _photo(500, 375)
    for kw in ({"restart_marker_rows": 1}, {"restart_marker_blocks": 7}, {"progressive": True}):
        raw = _jpeg(arr, **kw)
        want = _pillow(raw)
        for box in ((0, 0, 100, 40), (200, 100, 100, 100), (0, 0, 500, 375)):
            arr_out, _sub = roi.decode_crop(raw, box, SIZE)
            assert arr_out.size > 0
        np.testing.assert_array_equal(roi.decode_crop(raw, (0, 0, 500, 375), 500)[0][:, 1:-1],
                                      want[:, 1:-1])
    raw = _jpeg(arr)
    filled = raw[:-2] + b"\xff\xff\xff\xd9"  # fill bytes before EOI are legal
    roi.decode_crop(filled, (0, 0, 100, 40), SIZE)
    trailing = raw + b"trailing bytes after EOI \xff\x01"  # what follows EOI is not the image
    roi.decode_crop(trailing, (0, 0, 100, 40), SIZE)


@needs_roi
def test_metadata_warnings_are_not_errors():
    """libjpeg's warnings about metadata (here an unknown JFIF revision) leave the pixels right."""
    raw = bytearray(_jpeg(_photo(120, 90)))
    app0 = raw.index(b"JFIF\x00")
    assert raw[app0 + 5] == 1
    raw[app0 + 5] = 2  # JFIF 2.x: libjpeg warns "unknown JFIF revision number"
    raw = bytes(raw)
    np.testing.assert_array_equal(roi.decode_crop(raw, (0, 0, 120, 90), 120)[0][:, 1:-1],
                                  _pillow(raw)[:, 1:-1])
