"""Crop planning: pure functions from image size and a random generator to a box.

Planning is separate from pixel work (pipelines/cpu.py) so that tests can
check the sampling statistics exactly and other pipelines (DALI) can reuse it.
Boxes are (left, top, width, height) in pixels of the full-size image.
An output size is an int (square) or (height, width), as torchvision takes
it; `output_hw` is the one place that reads it.

`scale_denom` is the one rule for the DCT-scaled decode of a crop: Pillow's
`Image.draft` (pipelines/cpu.py) and the region decoder (pipelines/roi.py)
both ask it, so both scale the same crops by the same factor.
"""

from __future__ import annotations

import math
import random

SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
VAL_RESIZE_RATIO = 0.875  # val: shorter side resized to size / 0.875 (224 -> 256)
#: A DCT-scaled decode must leave the crop at least this many times the output
#: size: closer to 1, the scaled IDCT's blur is not averaged away by the resize
#: and PSNR against a full decode drops below 35 dB (34.2 dB at margin 1:
#: bench/results/README.md, "Quality").
DRAFT_MARGIN = 1.25


_MASK64 = (1 << 64) - 1


def output_hw(size: int | tuple[int, int]) -> tuple[int, int]:
    """(height, width) of an output size: an int (square) or (h, w), as in torchvision."""
    return (size, size) if isinstance(size, int) else (size[0], size[1])


def item_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The generator for one item's augmentation: a pure function of (seed, epoch, index).

    A Mersenne Twister seeded with the three numbers packed into one 192-bit
    integer (each taken modulo 2**64, so distinct triples give distinct seeds;
    `init_by_array` decorrelates neighbouring seeds). It is the same on every
    platform and Python version `random` keeps its seeding stable for. Python's
    `random.Random` because a crop takes a handful of draws: creating it and
    drawing a crop box and a flip costs ~25 us an item, against ~100 us with
    numpy's SeedSequence + PCG64 + Generator (bench/results/steps-photo.md,
    step "RNG + crop box + flip draw" and lever "rng").
    """
    return random.Random(((seed & _MASK64) << 128) | ((epoch & _MASK64) << 64) | (index & _MASK64))


def random_resized_crop_box(
    width: int, height: int, rng: random.Random,
    scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO,
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, including its center-crop fallback."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(width: int, height: int, size: int | tuple[int, int]) -> tuple[float, float, float, float]:
    """The region of the full image that torchvision's Resize(max(h, w)/0.875) + CenterCrop((h, w))
    keeps (for an int size: Resize(size/0.875) + CenterCrop(size)).

    The shorter side is resized to the longer output side / 0.875, so that the crop fits
    inside the resized image for any (h, w). Returned in full-image pixels (fractional),
    so that one resize with a box does both steps.
    """
    out_h, out_w = output_hw(size)
    resized = int(max(out_h, out_w) / VAL_RESIZE_RATIO)
    # torchvision Resize: the long side becomes int(resized * long / short)
    rw = resized if width <= height else int(resized * width / height)
    rh = resized if height <= width else int(resized * height / width)
    crop_w, crop_h = min(out_w, rw, rh), min(out_h, rw, rh)
    left = int(round((rw - crop_w) / 2.0))
    top = int(round((rh - crop_h) / 2.0))
    sx, sy = width / rw, height / rh
    return left * sx, top * sy, crop_w * sx, crop_h * sy


def scale_denom(box, size: int | tuple[int, int], image_size: tuple[int, int]) -> int:
    """The DCT-scale divisor (8, 4, 2 or 1) for decoding `box` of an image to `size`
    (an int: size x size; or (h, w)).

    The largest power of two that keeps the crop >= DRAFT_MARGIN x the output on
    both sides (its width against w, its height against h), rounded as Pillow's
    `JpegImageFile.draft` rounds a requested size (its scale is min(full //
    requested) over both sides), so that asking draft for (full_w // d, full_h
    // d) gives exactly this d.
    """
    out_h, out_w = output_hw(size)
    if out_h == out_w:  # square: the same float expression as always (the same d, bit for bit)
        factor = min(box[2], box[3]) / (out_w * DRAFT_MARGIN)
    else:
        factor = min(box[2] / out_w, box[3] / out_h) / DRAFT_MARGIN
    if factor < 2.0:
        return 1
    full_w, full_h = image_size
    want = min(full_w // math.ceil(full_w / factor), full_h // math.ceil(full_h / factor))
    for d in (8, 4, 2):
        if want >= d:
            return d
    return 1


def flip(rng: random.Random) -> bool:
    """Horizontal flip with probability 0.5."""
    return rng.random() < 0.5
