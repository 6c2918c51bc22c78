"""Crop planning follows torchvision's RandomResizedCrop statistics."""

import math

import numpy as np
import pytest

from coordl.pipelines import crop


def _boxes(width, height, n=4000, seed=0):
    return [crop.random_resized_crop_box(width, height, crop.item_rng(seed, 0, k)) for k in range(n)]


def test_boxes_inside_image_and_within_scale_and_ratio():
    width, height = 500, 375
    boxes = _boxes(width, height)
    scales, ratios = [], []
    for left, top, w, h in boxes:
        assert 0 <= left and 0 <= top and left + w <= width and top + h <= height
        scales.append(w * h / (width * height))
        ratios.append(w / h)
    scales, ratios = np.array(scales), np.array(ratios)
    # rounding w and h to ints moves area and ratio by a pixel's worth
    assert scales.min() >= 0.08 * 0.9 and scales.max() <= 1.0
    assert ratios.min() >= 3 / 4 * 0.93 and ratios.max() <= 4 / 3 / 0.93
    # scale ~ uniform(0.08, 1) for accepted draws: the mean sits below 0.54 (large draws are
    # rejected more often) but well above the lower bound
    assert 0.35 < scales.mean() < 0.56
    # log-ratio roughly symmetric around 0
    assert abs(np.log(ratios).mean()) < 0.03


def test_fallback_is_center_crop_clamped_to_ratio():
    # a 1000x20 strip: no draw fits, torchvision falls back to a centered crop at the max ratio
    left, top, w, h = crop.random_resized_crop_box(1000, 20, crop.item_rng(0, 0, 0))
    assert (w, h) == (round(20 * 4 / 3), 20)
    assert left == (1000 - w) // 2 and top == 0


def test_flip_half_the_time():
    flips = sum(crop.flip(crop.item_rng(3, 1, k)) for k in range(4000))
    # binomial(4000, 0.5): sd = 31.6; 5 sd bounds
    assert abs(flips - 2000) < 160


def _draws(seed, epoch, index, n=4):
    rng = crop.item_rng(seed, epoch, index)
    return [rng.random() for _ in range(n)]


def test_item_rng_is_a_pure_function_of_seed_epoch_index():
    a = _draws(7, 2, 11)
    assert a == _draws(7, 2, 11)
    for other in [(7, 3, 11), (8, 2, 11), (7, 2, 12), (-7, 2, 11), (11, 2, 7), (2, 7, 11), (0, 0, 0)]:
        assert a != _draws(*other), other


def test_item_rng_neighbouring_items_are_uncorrelated():
    # items k and k+1 (and epochs e and e+1) must not share or shift a stream
    first = np.array([_draws(0, 0, k, 2) for k in range(4001)])
    assert abs(np.corrcoef(first[:-1, 0], first[1:, 0])[0, 1]) < 0.06  # ~4 sd for n = 4000
    assert abs(np.corrcoef(first[:-1, 1], first[1:, 0])[0, 1]) < 0.06
    epochs = np.array([_draws(0, e, 5, 1)[0] for e in range(4001)])
    assert abs(np.corrcoef(epochs[:-1], epochs[1:])[0, 1]) < 0.06
    assert abs(first[:, 0].mean() - 0.5) < 0.02 and abs(epochs.mean() - 0.5) < 0.02


@pytest.mark.parametrize("w,h", [(500, 375), (375, 500), (224, 224), (640, 256)])
def test_center_crop_box_matches_torchvision_resize_then_center_crop(w, h):
    size = 224
    left, top, cw, ch = crop.center_crop_box(w, h, size)
    short = min(w, h)
    scale = 256 / short
    # the kept region is 224/256 of the shorter side, centred
    assert math.isclose(min(cw, ch), size / scale, rel_tol=0.02)
    assert math.isclose(left + cw / 2, w / 2, abs_tol=1.5 / scale)
    assert math.isclose(top + ch / 2, h / 2, abs_tol=1.5 / scale)


# -- size=(h, w), as torchvision takes it -----------------------------------------------------

def test_output_hw_reads_an_int_or_height_width():
    assert crop.output_hw(224) == (224, 224)
    assert crop.output_hw((224, 160)) == (224, 160)


@pytest.mark.parametrize("w,h", [(500, 375), (375, 500), (640, 256)])
@pytest.mark.parametrize("out_h,out_w", [(224, 160), (160, 224), (100, 300)])
def test_center_crop_box_of_height_width_matches_resize_then_center_crop(w, h, out_h, out_w):
    """Resize(max(h, w) / 0.875) on the shorter side, then CenterCrop((h, w)): the kept region
    has the output's aspect, is centred, and is the output size in resized pixels."""
    left, top, cw, ch = crop.center_crop_box(w, h, (out_h, out_w))
    scale = int(max(out_h, out_w) / crop.VAL_RESIZE_RATIO) / min(w, h)
    assert math.isclose(cw, out_w / scale, rel_tol=0.02) and math.isclose(ch, out_h / scale, rel_tol=0.02)
    assert math.isclose(left + cw / 2, w / 2, abs_tol=1.5 / scale)
    assert math.isclose(top + ch / 2, h / 2, abs_tol=1.5 / scale)
    assert 0 <= left and left + cw <= w + 1e-9 and 0 <= top and top + ch <= h + 1e-9


def test_a_square_height_width_is_the_int_size_exactly():
    for w, h in [(500, 375), (375, 500), (1500, 1125), (224, 224)]:
        assert crop.center_crop_box(w, h, (224, 224)) == crop.center_crop_box(w, h, 224)
        for box in _boxes(w, h, n=300):
            assert crop.scale_denom(box, (112, 112), (w, h)) == crop.scale_denom(box, 112, (w, h))


def test_scale_denom_keeps_both_sides_of_a_non_square_output_sharp():
    box = (0, 0, 600, 450)
    assert crop.scale_denom(box, 100, (1200, 900)) == 2          # 450 / (100 * 1.25) = 3.6
    assert crop.scale_denom(box, (224, 100), (1200, 900)) == 1   # height: 450 / (224 * 1.25) = 1.6
    assert crop.scale_denom(box, (100, 224), (1200, 900)) == 2   # width 600 / 280, height 450 / 125
