"""The fast CPU pipeline's output against a full-decode reference of the same crop.

The bench dataset's images (500x375 photos plus 20% at 1500x1125, quality 90)
are made here with the same generator and seed, so the first N files are
byte-identical to the first N of `coordl make-dataset DIR --images 3000
--classes 100 --large-fraction 0.2`. Set COORDL_QUALITY_DATA to an existing
ImageFolder to measure a whole dataset instead.

- `train`/`val` with both decode shortcuts (DCT-scaled `draft`, `partial`
  decode that stops below the crop) stay within PSNR >= 35 dB of decoding
  the full image, cropping, resizing (bilinear, antialiased) and flipping it
  the torchvision way.
- `partial` alone changes nothing: bit-identical pixels.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from coordl.pipelines import cpu, crop, roi, rows

SIZE = 224
EPOCHS = 3


def _reference_train(raw: bytes, seed: int, epoch: int, index: int) -> np.ndarray:
    """Full decode, then crop, resize and flip as a torchvision user writes it."""
    img = Image.open(io.BytesIO(raw)).convert("RGB")
    rng = crop.item_rng(seed, epoch, index)
    left, top, w, h = crop.random_resized_crop_box(*img.size, rng)
    flip = crop.flip(rng)
    img = img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def test_bench_sample_has_large_photos(bench_sample):
    sizes = {Image.open(io.BytesIO(r)).size for r in bench_sample}
    assert (500, 375) in sizes and (1500, 1125) in sizes


def test_train_psnr_against_full_decode_reference(bench_sample):
    psnrs, drafted = [], 0
    for epoch in range(EPOCHS):
        for i, raw in enumerate(bench_sample):
            fast = cpu.train(raw, SIZE, crop.item_rng(0, epoch, i))
            ref = _reference_train(raw, 0, epoch, i)
            psnrs.append(_psnr(fast, ref))
            drafted += int(not np.array_equal(
                fast, cpu.train(raw, SIZE, crop.item_rng(0, epoch, i), draft=False)))
    psnrs = np.array(psnrs)
    finite = psnrs[np.isfinite(psnrs)]
    print(f"train PSNR over {len(psnrs)} crops: min {finite.min():.1f} dB, "
          f"median {np.median(finite):.1f} dB, {len(psnrs) - len(finite)} identical; "
          f"{drafted} crops changed by the DCT-scaled decode")
    assert drafted > 0, "no crop of the sample used the DCT-scaled decode: the check checked nothing"
    assert finite.min() >= 35.0


def test_val_psnr_against_full_decode_reference(bench_sample):
    for raw in bench_sample:
        fast = cpu.val(raw, SIZE)
        ref = cpu.val(raw, SIZE, draft=False, partial=False)
        assert _psnr(fast, ref) >= 35.0


def test_partial_decode_is_bit_identical(bench_sample):
    stopped_early = 0
    for epoch in range(EPOCHS):
        for i, raw in enumerate(bench_sample):
            for draft in (False, True):
                # roi=False: this is rows.py's stop-below-the-crop decode (test_roi.py checks the ROI decoder)
                a = cpu.train(raw, SIZE, crop.item_rng(1, epoch, i), draft=draft, roi=False)
                b = cpu.train(raw, SIZE, crop.item_rng(1, epoch, i), draft=draft, partial=False)
                np.testing.assert_array_equal(a, b)
            img = cpu.open_image(raw)
            box = crop.random_resized_crop_box(*img.size, crop.item_rng(1, epoch, i))
            stopped_early += int(rows.rows_for_box(box, SIZE) < img.size[1])
    assert stopped_early > len(bench_sample)  # most random crops end above the bottom row


def test_top_rows_equal_the_full_decode(bench_sample):
    raw = bench_sample[0]
    full = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    img = cpu.open_image(raw)
    top = rows.top_rows(img, raw, 100)
    assert top is not None and top.size == (full.shape[1], 100)
    np.testing.assert_array_equal(np.asarray(top), full[:100])


def test_top_rows_declines_when_it_cannot_help(bench_sample):
    raw = bench_sample[0]
    img = cpu.open_image(raw)
    assert rows.top_rows(img, raw, img.size[1]) is None          # all rows wanted: full load
    cut = raw[: len(raw) // 2]
    assert rows.top_rows(cpu.open_image(cut), cut, 10) is None  # no end-of-image marker


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_truncated_jpeg_still_raises_whatever_the_crop(bench_sample, keep):
    raw = bench_sample[1]
    cut = raw[: int(len(raw) * keep)]
    for epoch in range(8):  # crops high and low in the image
        with pytest.raises(cpu.DecodeError, match="truncated"):
            cpu.train(cut, SIZE, crop.item_rng(0, epoch, 1))


def test_stream_that_ends_early_falls_back_to_full_load(bench_sample):
    # cut the entropy data and close the file with EOI: libjpeg pads the missing rows
    # (a warning, as for every Pillow load) and the sentinel row tells top_rows so
    raw = bench_sample[1]
    damaged = raw[: len(raw) // 3] + b"\xff\xd9"
    img = cpu.open_image(damaged)
    want = img.size[1] - 10
    top = rows.top_rows(img, damaged, want)
    full = np.asarray(Image.open(io.BytesIO(damaged)).convert("RGB"))
    if top is not None:  # the decoder produced every wanted row: they match a full load
        np.testing.assert_array_equal(np.asarray(top), full[:want])
    # Pillow's path gives Pillow's pixels; the region decoder refuses the padded rows
    out = cpu.train(damaged, SIZE, crop.item_rng(0, 0, 1), roi=False)
    ref = cpu.train(damaged, SIZE, crop.item_rng(0, 0, 1), partial=False)
    np.testing.assert_array_equal(out, ref)
    if roi.AVAILABLE:
        with pytest.raises(cpu.DecodeError, match="premature end of data segment"):
            cpu.train(damaged, SIZE, crop.item_rng(0, 0, 1))


def test_non_jpeg_and_grayscale_take_the_full_path(tmp_path):
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 400, 3), np.uint8))
    for fmt, img in (("PNG", rgb), ("JPEG", rgb.convert("L"))):
        buf = io.BytesIO()
        img.save(buf, fmt)
        opened = cpu.open_image(buf.getvalue())
        assert not rows.can_stop_early(opened)
        out = cpu.train(buf.getvalue(), SIZE, crop.item_rng(0, 0, 0))
        assert out.shape == (SIZE, SIZE, 3)
