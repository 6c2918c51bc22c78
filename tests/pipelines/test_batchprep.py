"""The batch path (pipelines/batchprep.py, batchdecode.py, batchaug.py, jpeghead.py) on CPU tensors.

The same code runs on a GPU with decoder "nvimgcodec" or "torchvision" on a CUDA device; here the
decoders are coordl's CPU decoder and, where the wheel is installed, nvImageCodec's CPU backend
(the same nvImageCodec calls as on a GPU). Checked: the CPU pipeline's boxes and flips, pixels
within PSNR >= 30 dB of the CPU pipeline (pipelines/cpu.py) for train and val, one batched
resize equal to Pillow's to a level, files the GPU decoders do not take counted as fallbacks,
corrupt files refused, never pictured.
"""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from coordl.errors import DecodeError
from coordl.pipelines import batchaug, batchdecode, batchprep, cpu, crop, jpeghead

sys.path.insert(0, str(Path(__file__).parent))
import jpeg_faults  # noqa: E402 (tests/pipelines, on sys.path above)

SIZE = 64
DECODERS = ["cpu"] + (["nvimgcodec"] if batchdecode.available("nvimgcodec") else [])
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() "
                          "is False): the GPU decoders run on CPU tensors in the other tests")


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _encode(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", **kw)
    return buf.getvalue()


def _run(raws, transform: str, decoder: str = "cpu", dtype=torch.uint8, epoch: int = 0):
    plans = [batchprep.plan_item(r, transform, SIZE, crop.item_rng(7, epoch, i)) for i, r in enumerate(raws)]
    prep = batchprep.BatchPrep(batchdecode.open_decoder(decoder, "cpu"), SIZE, dtype)
    return plans, prep.run(list(raws), plans)


def test_plans_draw_the_cpu_pipelines_box_and_flip(bench_sample):
    for i, raw in enumerate(bench_sample[:20]):
        plan = batchprep.plan_item(raw, "train", SIZE, crop.item_rng(7, 3, i))
        rng = crop.item_rng(7, 3, i)
        size = Image.open(io.BytesIO(raw)).size
        assert (plan.width, plan.height) == size
        assert plan.box == tuple(float(v) for v in crop.random_resized_crop_box(*size, rng))
        assert plan.flip == crop.flip(rng)
        x0, y0, x1, y1 = plan.region
        left, top, w, h = plan.box
        assert 0 <= x0 <= left and 0 <= y0 <= top and left + w <= x1 <= size[0] and top + h <= y1 <= size[1]
        val = batchprep.plan_item(raw, "val", SIZE, None)
        assert val.box == crop.center_crop_box(*size, SIZE) and not val.flip


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("transform", ["train", "val"])
def test_batch_is_within_30db_of_the_cpu_pipeline(bench_sample, decoder, transform):
    raws = bench_sample[:24]
    _plans, got = _run(raws, transform, decoder, epoch=1)
    assert got.kept == list(range(len(raws))) and not got.errors
    assert got.device_decodes == len(raws) and got.fallbacks == 0
    assert got.images is not None and got.images.shape == (len(raws), 3, SIZE, SIZE)
    assert got.images.dtype == torch.uint8
    worst = math.inf
    for i, raw in enumerate(raws):
        ref = cpu.train(raw, SIZE, crop.item_rng(7, 1, i)) if transform == "train" else cpu.val(raw, SIZE)
        worst = min(worst, _psnr(got.images[i].permute(1, 2, 0).numpy(), ref))
    assert worst >= 30.0, worst


def test_resize_is_pillows_bilinear_box_resize_to_a_level():
    rng = np.random.default_rng(0)
    small = [rng.integers(0, 255, (h // 4, w // 4, 3), dtype=np.uint8) for h, w in ((300, 400), (96, 72))]
    images = [np.asarray(Image.fromarray(a).resize((a.shape[1] * 4, a.shape[0] * 4))) for a in small]
    boxes, flips = [(30.5, 40.25, 300.5, 200.75), (5.0, 7.0, 60.0, 80.0)], [False, True]
    padded, sizes = batchaug.pack([torch.from_numpy(a.copy()) for a in images])
    out = batchaug.finish(batchaug.resize(padded, sizes, torch.tensor(boxes), torch.tensor(flips), (48, 40)),
                          torch.uint8)
    for a, (left, top, w, h), flip, o in zip(images, boxes, flips, out):
        ref = Image.fromarray(a).resize((40, 48), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        ref = np.asarray(ref.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else ref).astype(int)
        assert np.abs(o.permute(1, 2, 0).numpy().astype(int) - ref).max() <= 1


def test_float_output_is_normalised_channels_last(bench_sample):
    _plans, u8 = _run(bench_sample[:4], "val")
    _plans, f = _run(bench_sample[:4], "val", dtype=torch.bfloat16)
    assert f.images is not None and u8.images is not None
    assert f.images.dtype == torch.bfloat16 and f.images.is_contiguous(memory_format=torch.channels_last)
    mean = torch.tensor(batchaug.MEAN).view(1, 3, 1, 1)
    std = torch.tensor(batchaug.STD).view(1, 3, 1, 1)
    expect = (u8.images.float() / 255 - mean) / std
    assert (f.images.float() - expect).abs().max() < 0.05


def test_headers_say_what_gpu_decoders_take(bench_sample):
    arr = np.asarray(Image.open(io.BytesIO(bench_sample[0])).convert("RGB"))
    plain = jpeghead.read(_encode(arr))
    assert plain.device_ok and (plain.width, plain.height) == (arr.shape[1], arr.shape[0])
    assert jpeghead.read(_encode(arr[..., 0])).device_ok  # grey
    progressive = jpeghead.read(_encode(arr, progressive=True))
    assert not progressive.device_ok and progressive.reason == "progressive"
    buf = io.BytesIO()
    Image.fromarray(arr).convert("CMYK").save(buf, "JPEG")
    cmyk = jpeghead.read(buf.getvalue())
    assert not cmyk.device_ok and cmyk.components == 4 and "CMYK" in cmyk.reason
    with pytest.raises(DecodeError, match="not a JPEG"):
        jpeghead.read(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(DecodeError, match="no frame header"):
        jpeghead.read(bench_sample[0][:20])


def test_files_gpu_decoders_do_not_take_go_to_the_cpu_and_are_counted(bench_sample):
    arr = np.asarray(Image.open(io.BytesIO(bench_sample[0])).convert("RGB"))
    buf = io.BytesIO()
    Image.fromarray(arr).convert("CMYK").save(buf, "JPEG", quality=95)
    raws = [bench_sample[1], _encode(arr, progressive=True, quality=95), buf.getvalue(),
            jpeg_faults.reencoded(bench_sample[0], "PNG")]
    plans, got = _run(raws, "val")
    assert [p.device_ok for p in plans] == [True, False, False, False]
    assert got.kept == [0, 1, 2, 3] and got.device_decodes == 1 and got.fallbacks == 3
    assert got.images is not None
    for k in (1, 3):  # the same picture, through the CPU decoder
        assert _psnr(got.images[k].permute(1, 2, 0).numpy(), cpu.val(raws[k], SIZE)) >= 30.0


@pytest.mark.parametrize("fault", sorted(jpeg_faults.CORRUPT))
def test_corrupt_jpegs_are_refused_never_pictured(bench_sample, fault):
    """What the CPU pipeline refuses, the batch path refuses: up front where the bytes are read
    (markers, no image data), else when coordl's CPU decoder decodes the region."""
    bad = jpeg_faults.CORRUPT[fault](bench_sample[2])
    with pytest.raises(DecodeError):
        cpu.val(bad, SIZE)  # the CPU pipeline refuses it
    try:
        plan = batchprep.plan_item(bad, "val", SIZE, None)
    except DecodeError:
        return
    got = batchprep.BatchPrep(batchdecode.open_decoder("cpu", "cpu"), SIZE).run([bad], [plan])
    assert got.kept == [] and got.images is None and isinstance(got.errors[0], DecodeError)


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_file_the_decoder_fails_on_is_that_items_error_alone(bench_sample, decoder):
    """A file whose header and markers pass but which does not decode (a bogus Huffman table):
    the decoder fails on it (nvImageCodec: None), the CPU decoder confirms, and it is the error
    of its own position; the rest of the batch is prepared."""
    good = bench_sample[3]
    k = good.index(b"\xff\xc4")
    bad = good[:k + 5] + bytes([0xFF] * 16) + good[k + 21:]
    plans = [batchprep.plan_item(r, "val", SIZE, None) for r in (good, bad, good)]
    prep = batchprep.BatchPrep(batchdecode.open_decoder(decoder, "cpu"), SIZE)
    got = prep.run([good, bad, good], plans)
    assert got.kept == [0, 2] and list(got.errors) == [1] and isinstance(got.errors[1], DecodeError)
    assert got.images is not None and got.images.shape[0] == 2
    assert torch.equal(got.images[0], got.images[1])


def test_unknown_decoder_is_refused_naming_the_choices():
    from coordl.errors import ConfigError

    with pytest.raises(ConfigError, match="decoder='nvjpeg'.*auto, nvimgcodec, torchvision, cpu"):
        batchdecode.open_decoder("nvjpeg", "cpu")


@cuda
@pytest.mark.parametrize("decoder", ["nvimgcodec", "torchvision"])
def test_gpu_decoders_match_the_cpu_pipeline(bench_sample, decoder):
    if not batchdecode.available(decoder):
        pytest.skip(f"{decoder} is not installed ({batchdecode.INSTALL_HINT})")
    raws = bench_sample[:24]
    plans = [batchprep.plan_item(r, "train", SIZE, crop.item_rng(7, 0, i)) for i, r in enumerate(raws)]
    got = batchprep.BatchPrep(batchdecode.open_decoder(decoder, "cuda"), SIZE).run(list(raws), plans)
    assert got.images is not None and got.images.device.type == "cuda" and got.device_decodes == len(raws)
    for i, raw in enumerate(raws):
        ref = cpu.train(raw, SIZE, crop.item_rng(7, 0, i))
        assert _psnr(got.images[i].permute(1, 2, 0).cpu().numpy(), ref) >= 30.0
