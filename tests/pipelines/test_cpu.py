"""pipelines/cpu.py on inputs that are not plain 8-bit photos: decompression bombs, 16-bit PNGs.

- An image over Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS)
  raises DecodeError naming the size, the limit and how to raise it, on every
  path; through coordl.ImageFolder + coordl.DataLoader it is a SampleError
  naming the file, or is skipped and counted with on_error="skip".
- 16-bit greyscale PNGs are scaled to 8 bits (they used to come out white).
- DecodeError lives in coordl/errors.py; roi.py needs no import of cpu.py.
"""

from __future__ import annotations

import gc
import io
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import coordl
from coordl.errors import DecodeError, SampleError
from coordl.pipelines import cpu, crop, roi

SIZE = 32
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def uniform_gray_jpeg(width: int, height: int) -> bytes:
    """A real baseline greyscale JPEG of any size, every 8x8 block mid-grey: 6 bits a block.

    The header is Pillow's for an 8x8 image (libjpeg's standard Huffman tables)
    with the frame size patched; each block is coded as DC difference 0 (code
    00) and end-of-block (code 1010): 6 bits a block, so four blocks are the 3
    bytes 0x28 0xA2 0x8A. No byte is 0xFF, so nothing needs stuffing.
    """
    buf = io.BytesIO()
    Image.new("L", (8, 8), 128).save(buf, "JPEG", quality=90)
    head = bytearray(buf.getvalue())
    sof = head.index(b"\xff\xc0")
    head[sof + 5:sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    sos = head.index(b"\xff\xda")
    head = bytes(head[:sos + 2 + int.from_bytes(head[sos + 2:sos + 4], "big")])
    blocks = -(-width // 8) * -(-height // 8)
    data = b"\x28\xa2\x8a" * (blocks // 4)
    bits = "001010" * (blocks % 4)
    if bits:
        bits += "1" * (-len(bits) % 8)  # pad the last byte with 1s, as libjpeg does
        data += int(bits, 2).to_bytes(len(bits) // 8, "big")
    return head + data + b"\xff\xd9"


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return uniform_gray_jpeg(20000, 20000)


def test_the_crafted_jpeg_is_a_real_one():
    for wh in ((64, 48), (13, 7), (40, 8)):
        raw = uniform_gray_jpeg(*wh)
        img = Image.open(io.BytesIO(raw))
        img.load()  # Pillow decodes it with no error
        assert img.size == wh and img.getextrema() == (128, 128)
        assert cpu.decode(raw).size == wh
        assert set(np.unique(cpu.val(raw, SIZE))) == {128}


def test_a_bomb_raises_naming_size_limit_and_fix(bomb):
    # Pillow's own verdict on these bytes: refused as a decompression bomb
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(bomb))
    calls = {
        "train": lambda: cpu.train(bomb, SIZE, crop.item_rng(0, 0, 0)),
        "train, Pillow path": lambda: cpu.train(bomb, SIZE, crop.item_rng(0, 0, 0), roi=False),
        "val": lambda: cpu.val(bomb, SIZE),
        "decode": lambda: cpu.decode(bomb),
    }
    for name, call in calls.items():
        with pytest.raises(DecodeError, match="MAX_IMAGE_PIXELS") as info:
            call()
        msg = str(info.value)
        assert isinstance(info.value, SampleError), name
        assert "400,000,000" in msg or "400000000" in msg, (name, msg)
        assert "limit" in msg and "raise" in msg, (name, msg)
    with pytest.raises(DecodeError, match=r"20000x20000 = 400,000,000 pixels, over the decompression-bomb "
                                          r"limit of 178,956,970 pixels"):
        cpu.val(bomb, SIZE)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's, from Image.open
def test_the_limit_is_pillows_and_raising_it_lets_the_image_through(monkeypatch):
    raw = uniform_gray_jpeg(640, 480)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 640 * 480 // 2 - 1)   # Pillow refuses above twice it
    with pytest.raises(DecodeError, match=r"640x480 = 307,200 pixels.*PIL.Image.MAX_IMAGE_PIXELS = 153601"):
        cpu.train(raw, SIZE, crop.item_rng(0, 0, 0), roi=True)
    with pytest.raises(DecodeError, match=r"307200 pixels.*MAX_IMAGE_PIXELS"):   # Pillow's own refusal
        cpu.train(raw, SIZE, crop.item_rng(0, 0, 0), roi=False)
    with pytest.raises(DecodeError, match="MAX_IMAGE_PIXELS"):
        cpu.decode(raw)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 640 * 480 // 2)  # only Pillow's warning: decoded
    assert cpu.train(raw, SIZE, crop.item_rng(0, 0, 0)).shape == (SIZE, SIZE, 3)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert cpu.decode(raw).size == (640, 480)
    # PNG: Pillow's own error at twice the limit becomes a DecodeError too
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    buf = io.BytesIO()
    Image.new("RGB", (100, 100)).save(buf, "PNG")
    with pytest.raises(DecodeError, match="decompression bomb.*MAX_IMAGE_PIXELS"):
        cpu.val(buf.getvalue(), SIZE)


@pytest.fixture
def bomb_root(tmp_path, tiny_root, bomb):
    root = tmp_path / "bomb"
    shutil.copytree(tiny_root, root)
    (root / "class_0001" / "huge.jpg").write_bytes(bomb)
    return root


@pytest.mark.parametrize("transform", ["train", "val"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_bomb_in_a_dataset_raises_naming_the_file(bomb_root, workers, transform):
    ds = coordl.ImageFolder(bomb_root, transform=transform, size=SIZE)
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=workers, timeout=120 if workers else 0)
    with pytest.raises(SampleError, match=r"class_0001/huge\.jpg: .*20000x20000.*MAX_IMAGE_PIXELS") as info:
        for _ in loader:
            pass
    assert "on_error='skip'" in str(info.value)
    assert "DecompressionBombError" not in type(info.value).__name__
    del loader, info
    gc.collect()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bomb_in_a_dataset_is_skipped_and_counted(bomb_root, workers):
    ds = coordl.ImageFolder(bomb_root, transform="train", size=SIZE, on_error="skip")
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers,
                               generator=torch.Generator().manual_seed(0))
    for _epoch in range(2):
        assert sum(len(y) for _, y in loader) == len(ds) - 1 == 40
    stats = loader.stats()
    assert stats["errors_skipped"] == 2
    assert stats["samples"] == 80


# --- 16-bit PNG ---------------------------------------------------------------------------------


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_16_bit_greyscale_png_is_scaled_to_8_bits():
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 65536, (120, 160), dtype=np.uint16)
    wide[:10] = 65535  # white rows stay white, black rows black
    wide[10:20] = 0
    sixteen = _png(Image.fromarray(wide))
    assert Image.open(io.BytesIO(sixteen)).mode == "I;16"
    eight = _png(Image.fromarray((wide >> 8).astype(np.uint8), "L"))
    np.testing.assert_array_equal(np.asarray(cpu.decode(sixteen)), np.asarray(cpu.decode(eight)))
    for epoch in range(4):
        np.testing.assert_array_equal(cpu.train(sixteen, SIZE, crop.item_rng(0, epoch, 0)),
                                      cpu.train(eight, SIZE, crop.item_rng(0, epoch, 0)))
    np.testing.assert_array_equal(cpu.val(sixteen, SIZE), cpu.val(eight, SIZE))
    out = np.asarray(cpu.decode(sixteen))
    assert out.min() == 0 and out.max() == 255 and 100 < out[20:].mean() < 155  # not all white


def test_32_bit_integer_png_mode_is_scaled_too():
    """Older Pillow opened 16-bit greyscale PNGs as mode "I"; the same scaling applies."""
    wide = np.arange(0, 65536, 16, dtype=np.int32).reshape(64, 64)
    img = Image.fromarray(wide, "I")
    img.format = "PNG"
    got = np.asarray(cpu._load_rgb(img))
    np.testing.assert_array_equal(got[..., 0], (wide >> 8).astype(np.uint8))


# --- where things live ----------------------------------------------------------------------------


def test_decode_error_lives_in_coordl_errors():
    assert cpu.DecodeError is DecodeError and issubclass(DecodeError, SampleError)
    assert issubclass(DecodeError, coordl.CoordlError)


def test_roi_raises_without_importing_cpu():
    """No cpu <-> roi import cycle: roi's errors come from coordl/errors.py, not a lazy import of cpu."""
    code = (
        "import sys\n"
        "from coordl.pipelines import roi\n"
        "from coordl.errors import DecodeError\n"
        "if roi.AVAILABLE:\n"
        "    try:\n"
        "        roi.decode_crop(b'\\xff\\xd8\\xff\\xe0' + bytes(50), (0, 0, 10, 10), 8)\n"
        "    except DecodeError:\n"
        "        pass\n"
        "    else:\n"
        "        sys.exit('no DecodeError')\n"
        "sys.exit('cpu imported' if 'coordl.pipelines.cpu' in sys.modules else 0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert not hasattr(roi, "DRAFT_MARGIN") and not hasattr(cpu, "DRAFT_MARGIN")  # one rule: crop.py


def test_pipelines_cite_only_results_that_exist():
    cited = set()
    folder = os.path.join(REPO, "pipelines")
    for name in os.listdir(folder):
        if name.endswith((".py", ".c")):
            with open(os.path.join(folder, name)) as f:
                cited |= set(re.findall(r"bench/results/[\w.-]+\.md", f.read()))
    assert cited, "no citation found: the check checked nothing"
    missing = sorted(c for c in cited if not os.path.exists(os.path.join(REPO, c)))
    assert not missing, f"pipelines/ cite results that do not exist: {missing}"


# -- size=(h, w) ------------------------------------------------------------------------------

def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("hw", [(48, 32), (32, 48), (40, 40)])
def test_train_and_val_of_height_width_give_h_by_w_pixels(bench_sample, hw):
    for i, raw in enumerate(bench_sample[:8]):
        assert cpu.train(raw, hw, crop.item_rng(0, 0, i)).shape == (*hw, 3)
        assert cpu.val(raw, hw).shape == (*hw, 3)
        out = np.empty((*hw, 3), dtype=np.uint8)
        assert cpu.val(raw, hw, out=out) is out and np.array_equal(out, cpu.val(raw, hw))


def test_a_square_height_width_is_the_int_size_bit_for_bit(bench_sample):
    for i, raw in enumerate(bench_sample[:12]):
        assert np.array_equal(cpu.train(raw, (56, 56), crop.item_rng(1, 0, i)),
                              cpu.train(raw, 56, crop.item_rng(1, 0, i)))
        assert np.array_equal(cpu.val(raw, (56, 56)), cpu.val(raw, 56))


@pytest.mark.parametrize("hw", [(224, 160), (160, 224)])
def test_height_width_train_and_val_against_the_full_decode_reference(bench_sample, hw):
    """train: RandomResizedCrop((h, w)) + flip; val: Resize(max(h, w) / 0.875) + CenterCrop((h, w)),
    each done the torchvision way on the full decode; the fast path within 35 dB of it."""
    out_h, out_w = hw
    for i, raw in enumerate(bench_sample[:20]):
        img = Image.open(io.BytesIO(raw)).convert("RGB")
        rng = crop.item_rng(2, 0, i)
        left, top, w, h = crop.random_resized_crop_box(*img.size, rng)
        ref = img.crop((left, top, left + w, top + h)).resize((out_w, out_h), Image.Resampling.BILINEAR)
        if crop.flip(rng):
            ref = ref.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        assert _psnr(cpu.train(raw, hw, crop.item_rng(2, 0, i)), np.asarray(ref)) >= 35, f"train {i}"
        short, resized = min(img.size), int(max(hw) / crop.VAL_RESIZE_RATIO)
        rw, rh = (resized, int(resized * img.height / img.width)) if img.width == short else (
            int(resized * img.width / img.height), resized)
        big = img.resize((rw, rh), Image.Resampling.BILINEAR)
        cl, ct = int(round((rw - out_w) / 2)), int(round((rh - out_h) / 2))
        ref = np.asarray(big.crop((cl, ct, cl + out_w, ct + out_h)))
        assert _psnr(cpu.val(raw, hw), ref) >= 35, f"val {i}"


@pytest.mark.skipif(not roi.AVAILABLE, reason="the ROI decoder is not built")
def test_height_width_through_the_roi_decoder_equals_the_pillow_path(bench_sample):
    for i, raw in enumerate(bench_sample[:20]):
        for hw in ((224, 160), (96, 200)):
            assert np.array_equal(cpu.train(raw, hw, crop.item_rng(3, 0, i), draft=False),
                                  cpu.train(raw, hw, crop.item_rng(3, 0, i), draft=False, roi=False))
            d = np.abs(cpu.val(raw, hw).astype(int) - cpu.val(raw, hw, roi=False))
            assert d.max() <= 1, f"val {i} {hw}"
