"""DataLoader(device=...) (coordl/loader/devprep.py) on CPU tensors: workers send bytes, this process
prepares; the same items, labels and pixels (PSNR >= 30 dB) as the CPU pipeline, counters, bad files."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import torch

import coordl
from coordl.errors import ConfigError, SampleError


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _batches(root, workers: int, **kw):
    loader = coordl.DataLoader(coordl.ImageFolder(root, "train", size=64, seed=3), batch_size=8, shuffle=True,
                               num_workers=workers, **kw)
    return [(i.clone(), t.clone()) for i, t in loader], loader.stats()


@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_as_the_cpu_pipeline_within_30db(photo_root, workers):
    ref, ref_stats = _batches(photo_root, 0)
    got, stats = _batches(photo_root, workers, device="cpu", decoder="cpu")
    assert len(got) == len(ref) == 3
    for (gi, gl), (ri, rl) in zip(got, ref):
        assert gi.shape == ri.shape and gi.dtype == torch.uint8 and torch.equal(gl, rl)
        assert min(_psnr(a, b) for a, b in zip(gi, ri)) >= 30.0
    assert stats["gpu_decodes"] == 24 and stats["gpu_cpu_fallbacks"] == 0 and stats["gpu_prep_us"] > 0
    assert stats["samples"] == ref_stats["samples"] == 24 and stats["decodes"] == ref_stats["decodes"]


def test_a_file_the_decoder_fails_on_raises_naming_it_or_is_skipped(photo_root, tmp_path):
    root = str(tmp_path / "data")
    shutil.copytree(photo_root, root)
    cls = sorted(os.listdir(root))[0]
    name = sorted(os.listdir(os.path.join(root, cls)))[0]
    path = os.path.join(root, cls, name)
    raw = open(path, "rb").read()
    k = raw.index(b"\xff\xc4")
    with open(path, "wb") as f:  # a bogus Huffman table: header and markers pass, the decode fails
        f.write(raw[:k + 5] + bytes([0xFF] * 16) + raw[k + 21:])
    loader = coordl.DataLoader(coordl.ImageFolder(root, "val", size=32, manifest_cache="off"), batch_size=24,
                               device="cpu", decoder="cpu")
    with pytest.raises(SampleError, match=name):
        next(iter(loader))
    loader = coordl.DataLoader(coordl.ImageFolder(root, "val", size=32, manifest_cache="off", on_error="skip"),
                               batch_size=24, device="cpu", decoder="cpu")
    (images, labels), = list(loader)
    stats = loader.stats()
    assert images.shape[0] == len(labels) == 23 and stats["errors_skipped"] == 1 and stats["samples"] == 23


def test_resume_mid_epoch_gives_the_same_batches(photo_root):
    def loader():
        return coordl.DataLoader(coordl.ImageFolder(photo_root, "train", size=32, seed=5), batch_size=8,
                                 shuffle=True, device="cpu", decoder="cpu")
    first = loader()
    it = iter(first)
    next(it)
    state = first.state_dict()
    rest = [(i.clone(), t.clone()) for i, t in it]
    again = loader()
    again.load_state_dict(state)
    resumed = list(again)
    assert len(resumed) == len(rest) == 2
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resumed, rest))


def test_bad_arguments_are_refused(photo_root):
    ds = coordl.ImageFolder(photo_root, None)
    with pytest.raises(ConfigError, match="transform='train' or 'val'"):
        coordl.DataLoader(ds, batch_size=4, device="cpu")
    with pytest.raises(ConfigError, match="device_dtype"):
        coordl.DataLoader(coordl.ImageFolder(photo_root), batch_size=4, device="cpu", device_dtype=torch.int32)
    with pytest.raises(ConfigError, match="decoder='x'"):
        coordl.DataLoader(coordl.ImageFolder(photo_root), batch_size=4, device="cpu", decoder="x")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_batches_are_on_the_gpu(photo_root):
    loader = coordl.DataLoader(coordl.ImageFolder(photo_root, "train", size=64), batch_size=8, device="cuda")
    images, _labels = next(iter(loader))
    assert images.device.type == "cuda" and images.shape == (8, 3, 64, 64)
    assert np.isfinite(loader.stats()["gpu_prep_us"])
