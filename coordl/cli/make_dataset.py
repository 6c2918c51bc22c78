"""A deterministic ImageNet-like JPEG folder for tests, benchmarks and demos.

Each image is multi-octave smooth noise with a per-class tint plus film
grain, which JPEG compresses about as well as a photograph: 500x375 at
quality 90 gives files of about 90-120 KiB. Image k of a dataset depends only
on (seed, k), so the same command makes the same bytes on every machine
(for one Pillow build).

The folder must be new or empty: make_dataset never mixes its images with
what is there. ``overwrite=True`` (``--overwrite``) first removes a dataset
make_dataset wrote before (``class_NNNN/img_NNNNNNN.jpg`` and nothing else),
so the folder then holds exactly the new one; anything else in the folder is
refused, never deleted.
"""

from __future__ import annotations

import io
import os
import re
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

from coordl.errors import ConfigError

_CLASS = re.compile(r"class_\d{4}")
_IMAGE = re.compile(r"img_\d{7}\.jpg")

_OCTAVES = ((3, 1.0), (6, 0.77), (12, 0.63), (24, 0.5), (48, 0.4), (96, 0.32), (192, 0.25))


def parse_dims(text: str) -> tuple[int, int]:
    """'500x375' -> (500, 375)."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"size {text!r} is not WIDTHxHEIGHT, e.g. 500x375") from None
    if w < 8 or h < 8:
        raise ConfigError(f"size {text!r} is too small: width and height must be at least 8")
    return w, h


def make_image(seed: int, index: int, label: int, width: int, height: int) -> Image.Image:
    rng = np.random.default_rng((seed, index))
    out = np.zeros((height, width, 3), np.float32)
    for cells, amp in _OCTAVES:
        cells_y = max(2, cells * height // max(width, height))
        cells_x = max(2, cells * width // max(width, height))
        grid = rng.integers(0, 256, (cells_y + 1, cells_x + 1, 3), dtype=np.uint8)
        up = Image.fromarray(grid, "RGB").resize((width, height), Image.Resampling.BICUBIC)
        out += amp * np.asarray(up, dtype=np.float32)
    tint = np.random.default_rng((seed, 1 << 20, label)).uniform(0.55, 1.0, 3).astype(np.float32)
    out *= tint * (255.0 / out.max())
    out += rng.normal(0.0, rng.uniform(16, 28), out.shape).astype(np.float32)
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8), "RGB")


def _write_one(args: tuple) -> int:
    root, seed, k, label, w, h, quality = args
    path = os.path.join(root, f"class_{label:04d}", f"img_{k:07d}.jpg")
    buf = io.BytesIO()
    make_image(seed, k, label, w, h).save(buf, "JPEG", quality=quality)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return len(buf.getvalue())


def make_dataset(
    root: str, images: int, classes: int, size: tuple[int, int] = (500, 375), quality: int = 90,
    seed: int = 0, large_fraction: float = 0.0, large_size: tuple[int, int] = (1500, 1125),
    workers: int | None = None, progress: bool = True, overwrite: bool = False,
) -> int:
    """Write `images` JPEGs into `classes` class folders under `root`; returns total bytes.

    ``large_fraction`` of the images (chosen by seed) are ``large_size``
    instead of ``size``, like the large photos real datasets contain.
    `root` must be new or empty, or with ``overwrite`` hold only an earlier
    make_dataset output, which is removed first (module docstring).
    """
    if images < 1 or classes < 1:
        raise ConfigError(f"--images {images} and --classes {classes} must both be at least 1")
    if classes > images:
        raise ConfigError(f"--classes {classes} is more than --images {images}: every class needs an image")
    if not 1 <= quality <= 100:
        raise ConfigError(f"--quality {quality} must be between 1 and 100")
    _prepare(root, overwrite)
    try:
        for c in range(classes):
            os.makedirs(os.path.join(root, f"class_{c:04d}"), exist_ok=True)
    except OSError as e:
        raise ConfigError(f"make-dataset: cannot create the folder {root!r} ({e}): pass a folder "
                          "you can write") from None
    large = np.random.default_rng((seed, 7)).random(images) < large_fraction
    jobs = [(root, seed, k, k % classes, *(large_size if large[k] else size), quality)
            for k in range(images)]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    from tqdm import tqdm

    total = 0
    try:
        with ProcessPoolExecutor(workers) as pool:
            for n in tqdm(pool.map(_write_one, jobs, chunksize=16), total=len(jobs),
                          desc="make-dataset", unit="img", disable=not progress):
                total += n
    except OSError as e:
        raise ConfigError(f"make-dataset: cannot write the images into {root!r} ({e}): pass a "
                          "folder you can write, with room for them") from None
    return total


def _prepare(root: str, overwrite: bool) -> None:
    """Refuse a non-empty `root` (ConfigError naming it and --overwrite); with `overwrite`,
    remove an earlier make_dataset output, and refuse anything else it holds."""
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return
    except OSError as e:  # a file, or a folder that cannot be read
        raise ConfigError(f"make-dataset: cannot use {root!r} as the dataset folder ({e}): pass a "
                          "new or empty folder") from None
    if not entries:
        return
    if not overwrite:
        raise ConfigError(f"make-dataset: the folder {root!r} is not empty ({len(entries)} entries, "
                          f"e.g. {entries[0]!r}): writing into it would mix the new images with "
                          "what is there. Pass --overwrite (overwrite=True) to replace a dataset "
                          "make-dataset wrote there, or pass a new or empty folder")
    files = []
    for name in entries:
        folder = os.path.join(root, name)
        inside = sorted(os.listdir(folder)) if _CLASS.fullmatch(name) and os.path.isdir(folder) \
            and not os.path.islink(folder) else None
        other = name if inside is None else next(
            (os.path.join(name, f) for f in inside if not _IMAGE.fullmatch(f)
             or not os.path.isfile(os.path.join(folder, f))), None)
        if other is not None or inside is None:
            raise ConfigError(f"make-dataset --overwrite: {root!r} holds {other or name!r}, which "
                              "make-dataset did not write (it writes class_NNNN/img_NNNNNNN.jpg): "
                              "--overwrite replaces only a dataset it made; move that away or "
                              "pass a new or empty folder")
        files += [os.path.join(folder, f) for f in inside]
    try:
        for path in files:
            os.unlink(path)
        for name in entries:
            os.rmdir(os.path.join(root, name))
    except OSError as e:
        raise ConfigError(f"make-dataset --overwrite: cannot remove the old dataset in {root!r} "
                          f"({e}): remove it yourself or pass a new or empty folder") from None
