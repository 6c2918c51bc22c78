"""pipelines/dali.py on the CPU (device_id=None): pixels against the CPU pipeline, determinism, errors.

The bench-like sample (500x375 photos, 20% at 1500x1125) decoded by DALI must
match pipelines/cpu.py's `train` (same boxes, same flips: both draw from
crop.item_rng) and `val` within the quality test's PSNR bar, and against a
full-decode reference of the same box.
"""

from __future__ import annotations

import io
import math
import sys

import numpy as np
import pytest
from PIL import Image

from coordl.errors import ConfigError
from coordl.pipelines import cpu, crop, dali

pytest.importorskip("nvidia.dali")

SIZE = 224
PSNR_MIN = 35.0  # the quality test's bar (tests/pipelines/test_quality.py)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _run(recipe: dali.Recipe, raws, items, epoch: int, threads: int = 2, batch: int | None = None):
    prep = dali.Prep(recipe, batch or len(raws), threads)
    prep.submit(raws, items, epoch)
    return prep.take()


def _reference(raw: bytes, box, flip: bool) -> np.ndarray:
    """Full decode, one bilinear resize of the box (fractional boxes too), flip."""
    img = Image.open(io.BytesIO(raw)).convert("RGB")
    left, top, w, h = box
    out = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    return np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out)


def test_val_matches_the_cpu_pipeline_and_the_full_decode(bench_sample):
    got = _run(dali.Recipe("val", SIZE, layout="HWC"), bench_sample, range(len(bench_sample)), 0)
    assert got.kept == list(range(len(bench_sample))) and not got.errors
    assert got.images.shape == (len(bench_sample), SIZE, SIZE, 3) and got.images.dtype == np.uint8
    to_cpu, to_ref = [], []
    for k, raw in enumerate(bench_sample):
        to_cpu.append(_psnr(got.images[k], cpu.val(raw, SIZE)))
        w, h = Image.open(io.BytesIO(raw)).size
        to_ref.append(_psnr(got.images[k], _reference(raw, crop.center_crop_box(w, h, SIZE), False)))
    print(f"val PSNR vs CPU backend: min {min(to_cpu):.1f} dB, vs full decode: min {min(to_ref):.1f} dB")
    assert min(to_cpu) >= PSNR_MIN and min(to_ref) >= PSNR_MIN


def test_train_crops_the_cpu_pipelines_boxes(bench_sample):
    flips = 0
    for epoch in range(2):
        got = _run(dali.Recipe("train", SIZE, seed=3, layout="HWC"), bench_sample,
                   range(len(bench_sample)), epoch)
        for k, raw in enumerate(bench_sample):
            rng = crop.item_rng(3, epoch, k)
            box = crop.random_resized_crop_box(*Image.open(io.BytesIO(raw)).size, rng)
            flip = crop.flip(rng)
            flips += flip
            assert _psnr(got.images[k], cpu.train(raw, SIZE, crop.item_rng(3, epoch, k))) >= PSNR_MIN
            assert _psnr(got.images[k], _reference(raw, box, flip)) >= PSNR_MIN
    assert 0 < flips < 2 * len(bench_sample)  # both branches of the flip were checked


def test_a_batch_is_a_pure_function_of_seed_epoch_and_items(bench_sample):
    raws, items = bench_sample[:12], list(range(100, 112))
    recipe = dali.Recipe("train", 64, seed=7)
    first = _run(recipe, raws, items, epoch=4, threads=1).images
    again = _run(recipe, raws, items, epoch=4, threads=3).images          # other thread count
    np.testing.assert_array_equal(first, again)
    prep = dali.Prep(recipe, 6, 2)                                          # other batch split
    halves = []
    for lo in (0, 6):
        prep.submit(raws[lo:lo + 6], items[lo:lo + 6], 4)
    for _ in range(2):
        halves.append(prep.take().images)
    np.testing.assert_array_equal(first, np.concatenate(halves))
    other_epoch = _run(recipe, raws, items, epoch=5).images
    other_seed = _run(dali.Recipe("train", 64, seed=8), raws, items, epoch=4).images
    assert not np.array_equal(first, other_epoch) and not np.array_equal(first, other_seed)
    alone = _run(recipe, [raws[5]], [105], epoch=4).images[0]   # item identity, not position
    np.testing.assert_array_equal(alone, first[5])


def test_layouts_and_float_normalization(bench_sample):
    raws, items = bench_sample[:4], range(4)
    hwc = _run(dali.Recipe("val", 32, layout="HWC"), raws, items, 0).images
    chw = _run(dali.Recipe("val", 32, layout="CHW"), raws, items, 0).images
    np.testing.assert_array_equal(chw, hwc.transpose(0, 3, 1, 2))
    mean, std = (124.0, 116.0, 104.0), (58.0, 57.0, 57.0)
    flt = _run(dali.Recipe("val", 32, mean=mean, std=std), raws, items, 0).images
    assert flt.dtype == np.float32 and flt.shape == chw.shape
    per_channel = (slice(None), None, None)
    want = (chw.astype(np.float32) - np.array(mean, np.float32)[per_channel]) / np.array(std, np.float32)[per_channel]
    np.testing.assert_allclose(flt, want, atol=1e-4)


def _png_cut(raw: bytes) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(raw)).save(buf, "PNG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]


def test_bad_bytes_are_refused_per_position_and_the_rest_decoded(bench_sample):
    good = bench_sample[:3]
    cut = bench_sample[3][: len(bench_sample[3]) // 2]               # JPEG without its end: host check
    png = _png_cut(bench_sample[4])                                    # header fine, DALI fails on it
    raws = [good[0], b"", cut, good[1], b"not an image at all", png, good[2]]
    prep = dali.Prep(dali.Recipe("val", 32, layout="HWC"), len(raws), 2)
    prep.submit(raws, list(range(len(raws))), 0)
    prep.submit(good, [0, 3, 6], 0)                                   # in flight behind the bad batch
    got = prep.take()
    assert got.kept == [0, 3, 6] and sorted(got.errors) == [1, 2, 4, 5]
    assert "empty" in str(got.errors[1]) and "truncated" in str(got.errors[2])
    assert "not an image" in str(got.errors[4]) and "DALI cannot decode it" in str(got.errors[5])
    assert all(isinstance(e, cpu.DecodeError) for e in got.errors.values())
    assert prep.rebuilds == 2                                         # the batch, then the culprit
    after = prep.take()                                               # fed again after the rebuild
    np.testing.assert_array_equal(after.images, got.images)
    ref = _run(dali.Recipe("val", 32, layout="HWC"), good, [0, 3, 6], 0).images
    np.testing.assert_array_equal(got.images, ref)


def test_a_jpeg_with_bytes_after_its_end_marker_is_not_truncated(bench_sample):
    raw = bench_sample[0] + b"\x00" * 16
    got = _run(dali.Recipe("val", 32), [raw, bench_sample[0]], [0, 0], 0)
    assert got.kept == [0, 1]
    np.testing.assert_array_equal(got.images[0], got.images[1])


def test_prep_into_writes_kept_rows_in_order(bench_sample):
    recipe = dali.Recipe("train", 48, seed=1, layout="HWC")
    prep = dali.Prep(recipe, 8, 2)
    raws = [bench_sample[0], b"", bench_sample[1], bench_sample[2]]
    out = np.zeros((8, 48, 48, 3), np.uint8)
    kept, errors = prep.prep_into(raws, [10, 11, 12, 13], 2, out)
    assert kept == [0, 2, 3] and list(errors) == [1]
    ref = _run(recipe, [raws[k] for k in kept], [10, 12, 13], 2).images
    np.testing.assert_array_equal(out[:3], ref)
    assert not out[3:].any()
    with pytest.raises(ConfigError, match=r"layout='CHW'"):
        dali.Prep(dali.Recipe("val", 48), 8).prep_into(raws, [10, 11, 12, 13], 2, out)


def test_empty_and_all_bad_batches(bench_sample):
    prep = dali.Prep(dali.Recipe("val", 32), 4, depth=3)
    prep.submit([b""], [0], 0)
    prep.submit([], [], 0)
    prep.submit(bench_sample[:1], [0], 0)
    first, second, third = prep.take(), prep.take(), prep.take()
    assert first.kept == [] and list(first.errors) == [0] and first.images is None
    assert second.kept == [] and not second.errors
    assert third.kept == [0] and third.images.shape == (1, 3, 32, 32)


@pytest.mark.parametrize("kwargs,match", [
    ({"transform": "flip"}, "transform='flip'"), ({"size": 0}, "size=0"),
    ({"layout": "NHWC"}, "layout='NHWC'"), ({"device": "tpu"}, "device='tpu'"),
    ({"mean": (1, 2, 3)}, "give both"), ({"mean": (1, 2), "std": (1, 2)}, "three values"),
    ({"mean": (1, 2, 3), "std": (1, 0, 1)}, "std > 0"),
])
def test_recipe_refuses_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        dali.Recipe(**kwargs)


def test_prep_refuses_misuse(bench_sample):
    with pytest.raises(ConfigError, match="batch_size=0"):
        dali.Prep(dali.Recipe(), 0)
    prep = dali.Prep(dali.Recipe("val", 32), 2, depth=1)
    with pytest.raises(ConfigError, match="exceeds the pipeline's batch_size=2"):
        prep.submit(bench_sample[:3], [0, 1, 2], 0)
    prep.submit(bench_sample[:1], [0], 0)
    with pytest.raises(ConfigError, match="in flight"):
        prep.submit(bench_sample[:1], [0], 0)
    with pytest.raises(ConfigError, match="needs a device_id"):
        dali.build_pipeline(dali.Recipe(device="gpu"), 2, 1, None)


def test_require_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # what an environment without DALI sees
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[dali\]'"):
        dali.require()
