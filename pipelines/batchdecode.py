"""Batch JPEG decoders behind one small interface: encoded buffers and regions in, device pixels out.

    decoder = open_decoder("auto", torch.device("cuda"))
    got = decoder.decode(raws, regions)    # regions: (x0, y0, x1, y1) in full-image pixels
    # got[k]: Decoded(pixels uint8 (h, w, 3) on decoder.device, x0, y0) covering regions[k],
    #         None (this decoder refused the file: give it to the CPU decoder), or a DecodeError

Backends:
- ``"nvimgcodec"``: NVIDIA nvImageCodec (``nvidia.nvimgcodec``: the A100/H100/H200 hardware
  JPEG engines, else nvJPEG on the GPU), region-of-interest decode, one call per batch. On a
  CPU device it runs nvImageCodec's own CPU backend (libjpeg-turbo), which loads without a
  GPU driver: the same calls run in CI. nvImageCodec answers None for a file it cannot
  decode, corrupt or unsupported alike; both go to the CPU decoder, which refuses the corrupt.
- ``"torchvision"``: ``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG, whole
  images; the region is a view). A batch it fails on goes to the CPU decoder, whole.
- ``"cpu"``: coordl's region decoder (pipelines/roi.py, libjpeg-turbo) when it is built,
  else Pillow; the fallback of the others and what tests run the batch logic with.

Decoders return regions as they decode them: (pixels, x0, y0) where (x0, y0) is where the
pixels start in the full image (the region decoder aligns x0 down to an iMCU); the caller
resamples from there (pipelines/batchaug.py). Never a picture of corrupt data: a decoder's
failure is None or a DecodeError for that image alone.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from coordl.errors import ConfigError, DecodeError

from . import cpu, jpeghead
from . import roi as jpegroi

DECODERS = ("auto", "nvimgcodec", "torchvision", "cpu")
INSTALL_HINT = "pip install 'coordl[gpu]' (nvidia-nvimgcodec-cu12 or -cu13, torchvision)"


@dataclass
class Decoded:
    pixels: torch.Tensor  # uint8 (h, w, 3), RGB, on the decoder's device
    x0: int               # where pixels[0, 0] is in the full image
    y0: int


Result = Decoded | DecodeError | None


class CpuDecoder:
    """coordl's region decoder (libjpeg-turbo) when built, else Pillow; pixels moved to `device`."""

    name = "cpu"

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def decode(self, raws: Sequence[Any], regions: Sequence[tuple[int, int, int, int]]) -> list[Result]:
        return [self._one(raw, region) for raw, region in zip(raws, regions)]

    def _one(self, raw, region) -> Result:
        try:
            arr, x0, y0 = self._region(raw, region)
        except DecodeError as e:
            return e
        if not arr.flags.writeable:  # the region decoder's bytes: torch wants a writable array
            arr = arr.copy()
        return Decoded(torch.from_numpy(arr).to(self.device, non_blocking=True), x0, y0)

    @staticmethod
    def _region(raw, region) -> tuple[np.ndarray, int, int]:
        x0, y0, x1, y1 = region
        if jpegroi.AVAILABLE and jpegroi.is_jpeg(raw):
            width, height, supported = jpegroi.header(raw)
            if supported:
                cpu.check_pixels(width, height)
                got = _roi_decode(raw, x0, y0, x1, y1)
                if got is not None:
                    return got
        full = np.asarray(cpu.decode(raw))  # RGB; DecodeError for corrupt data
        return np.ascontiguousarray(full[y0:y1, x0:x1]), x0, y0


def _roi_decode(raw, x0: int, y0: int, x1: int, y1: int) -> tuple[np.ndarray, int, int] | None:
    try:
        got = jpegroi._lib().decode(raw, 1, x0, y0, x1, y1, 3)
    except ValueError as e:
        raise jpegroi._decode_error(e) from None
    if got is None:
        return None
    pixels, xoff, yoff, rw, rh, _sw, _sh = got
    return np.frombuffer(pixels, dtype=np.uint8).reshape(rh, rw, 3), xoff, yoff


class NvImgCodecDecoder:
    """nvImageCodec's batched decoder, with region-of-interest decode (see the module notes)."""

    name = "nvimgcodec"

    def __init__(self, device: torch.device | str) -> None:
        nvimgcodec: Any = importlib.import_module("nvidia.nvimgcodec")  # ImportError: not installed

        self._nv, self.device = nvimgcodec, torch.device(device)
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._decoder = nvimgcodec.Decoder(device_id=index)
        else:
            self._decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                               backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])
        self._params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB)

    def decode(self, raws: Sequence[Any], regions: Sequence[tuple[int, int, int, int]]) -> list[Result]:
        nv = self._nv
        streams = [nv.CodeStream(np.frombuffer(raw, dtype=np.uint8)).get_sub_code_stream(
            region=nv.Region(start=(y0, x0), end=(y1, x1))) for raw, (x0, y0, x1, y1) in zip(raws, regions)]
        if self.device.type == "cuda":
            images = self._decoder.decode(streams, params=self._params,
                                          cuda_stream=torch.cuda.current_stream(self.device).cuda_stream)
            pixels = [None if im is None else torch.as_tensor(im, device=self.device) for im in images]
        else:
            images = self._decoder.decode(streams, params=self._params)
            pixels = [None if im is None else torch.from_numpy(np.asarray(im.cpu())) for im in images]
        return [None if p is None or p.ndim != 3 or p.shape[2] != 3 else Decoded(p, r[0], r[1])
                for p, r in zip(pixels, regions)]


class TorchvisionDecoder:
    """``torchvision.io.decode_jpeg`` on a list, on the GPU (nvJPEG): whole images, regions as views."""

    name = "torchvision"

    def __init__(self, device: torch.device | str) -> None:
        io: Any = importlib.import_module("torchvision.io")  # ImportError: not installed

        self._decode, self._mode, self.device = io.decode_jpeg, io.ImageReadMode.RGB, torch.device(device)

    def decode(self, raws: Sequence[Any], regions: Sequence[tuple[int, int, int, int]]) -> list[Result]:
        datas = [torch.frombuffer(bytearray(raw), dtype=torch.uint8) for raw in raws]
        try:
            images = self._decode(datas, mode=self._mode, device=self.device)
        except RuntimeError:  # one bad file fails the batch: all of it goes to the CPU decoder
            return [None] * len(raws)
        return [Decoded(im[:, y0:y1, x0:x1].permute(1, 2, 0), x0, y0)
                for im, (x0, y0, x1, y1) in zip(images, regions)]


def available(name: str) -> bool:
    """Is the decoder `name`'s package importable here?"""
    module = {"nvimgcodec": "nvidia.nvimgcodec", "torchvision": "torchvision.io"}.get(name)
    if module is None:
        return name == "cpu"
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def open_decoder(name: str, device: torch.device | str) -> CpuDecoder | NvImgCodecDecoder | TorchvisionDecoder:
    """The decoder `name` (one of DECODERS) for `device`. ``"auto"``: on a CUDA device
    nvImageCodec, else torchvision (ConfigError naming the extra when neither loads); on the CPU
    coordl's own."""
    device = torch.device(device)
    if name not in DECODERS:
        raise ConfigError(f"decoder={name!r} is not known: use one of {', '.join(DECODERS)}")
    if name == "cpu" or (name == "auto" and device.type != "cuda"):
        return CpuDecoder(device)
    tried = []
    for candidate in (("nvimgcodec", "torchvision") if name == "auto" else (name,)):
        try:
            return NvImgCodecDecoder(device) if candidate == "nvimgcodec" else TorchvisionDecoder(device)
        except (ImportError, RuntimeError, OSError) as e:
            tried.append(f"{candidate}: {type(e).__name__}: {e}")
    raise ConfigError(f"decoder={name!r} on {device}: no GPU JPEG decoder loads ({'; '.join(tried)}): "
                      f"{INSTALL_HINT}, or pass decoder='cpu'")


def headers(raws: Sequence[Any]) -> list[jpeghead.JpegHeader | DecodeError]:
    """Each buffer's JPEG header, or the DecodeError reading it."""
    out: list[jpeghead.JpegHeader | DecodeError] = []
    for raw in raws:
        try:
            out.append(jpeghead.read(raw))
        except DecodeError as e:
            out.append(e)
    return out
