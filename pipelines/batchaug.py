"""Whole-batch crop + resize + flip in torch: decoded regions in, (B, 3, H, W) out, no per-image loop.

    padded, sizes = pack([decoded.pixels, ...])                    # (B, Hm, Wm, 3) uint8, one op
    images = resize(padded, sizes, boxes, flips, (224, 224))       # (B, 3, 224, 224) float32
    out = finish(images, torch.uint8)                              # or a normalised float/bf16

The resize is Pillow's ``Image.resize(size, BILINEAR, box=...)`` (what the CPU pipeline,
pipelines/cpu.py, does) written as two batched matrix products: each image's output row y
is a weighted sum of input rows with the triangle filter Pillow uses, widened by the
downscale factor (antialiasing), cut where Pillow cuts it and normalised; the same for
columns. Row weights (B, H, Hm) and column weights (B, W, Wm) are built for the whole batch
at once from the boxes (each image's own scale and offset; rows and columns past an image's
own size get weight 0, so padding never leaks in), a flip is the column weights reversed,
and ``images = Wy @ padded @ Wx^T`` is two ``bmm`` launches. What differs from Pillow is
rounding only (Pillow rounds to 8 bits between its two passes and uses fixed-point weights).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

#: torchvision's ImageNet statistics, on the 0..1 scale: the normalisation of a float output
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
OUT_DTYPES = (torch.uint8, torch.float32, torch.float16, torch.bfloat16)


def pack(pixels: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(padded (B, Hm, Wm, 3) uint8, sizes (B, 2) int64 of (h, w)) of a list of (h, w, 3) images,
    in one nested-to-padded conversion (no copy per image)."""
    device = pixels[0].device
    sizes = torch.tensor([tuple(p.shape[:2]) for p in pixels], dtype=torch.int64)
    with warnings.catch_warnings():  # "nested tensors are in prototype stage": the strided layout is what
        warnings.simplefilter("ignore")  # takes images of different heights AND widths
        nested = torch.nested.as_nested_tensor(list(pixels), device=device)
        padded = torch.nested.to_padded_tensor(nested, 0)
    return padded, sizes.to(device)


def weights(start: torch.Tensor, extent: torch.Tensor, out: int, size: torch.Tensor, span: int) -> torch.Tensor:
    """(B, out, span) float32 resampling weights of one axis: output k of image b reads input
    positions 0..size[b]-1 around start[b] + (k + 0.5) * extent[b] / out, as Pillow's bilinear."""
    device = start.device
    start, extent = start.to(torch.float64), extent.to(torch.float64)
    scale = (extent / out)[:, None, None]
    filter_scale = scale.clamp(min=1.0)  # downscaling widens the filter: antialiasing
    support = filter_scale                  # the bilinear (triangle) filter's support is 1
    center = start[:, None, None] + (torch.arange(out, device=device, dtype=torch.float64)[None, :, None] + 0.5) * scale
    pos = torch.arange(span, device=device, dtype=torch.float64)[None, None, :]
    lo = (center - support + 0.5).floor().clamp(min=0)  # Pillow's window: [lo, hi)
    hi = torch.minimum((center + support + 0.5).floor(), size.to(device, torch.float64)[:, None, None])
    w = (1.0 - ((pos - center + 0.5) / filter_scale).abs()).clamp(min=0.0)
    w = torch.where((pos >= lo) & (pos < hi), w, torch.zeros((), dtype=w.dtype, device=device))
    total = w.sum(dim=2, keepdim=True)
    return (w / torch.where(total > 0, total, torch.ones((), dtype=w.dtype, device=device))).to(torch.float32)


def resize(padded: torch.Tensor, sizes: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor,
           out_hw: tuple[int, int]) -> torch.Tensor:
    """(B, 3, H, W) float32 on 0..255: box b of image b (left, top, width, height, in its
    pixels; sizes[b] = (h, w) of it) resized to `out_hw`, flipped left-right where flips[b]."""
    batch, span_h, span_w, _ = padded.shape
    out_h, out_w = out_hw
    boxes = boxes.to(padded.device, torch.float64)
    wy = weights(boxes[:, 1], boxes[:, 3], out_h, sizes[:, 0], span_h)           # (B, H, Hm)
    wx = weights(boxes[:, 0], boxes[:, 2], out_w, sizes[:, 1], span_w)           # (B, W, Wm)
    wx = torch.where(flips.to(padded.device)[:, None, None], wx.flip(1), wx)    # a flip reverses the output columns
    rows = torch.bmm(wy, padded.reshape(batch, span_h, span_w * 3).to(torch.float32))  # (B, H, Wm*3)
    rows = rows.view(batch, out_h, span_w, 3).permute(0, 3, 1, 2).reshape(batch, 3 * out_h, span_w)
    return torch.bmm(rows, wx.transpose(1, 2)).view(batch, 3, out_h, out_w)


def finish(images: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The float 0..255 batch as `dtype`: uint8 rounded, or a float normalised by MEAN/STD in
    channels_last memory; written into `out` (of that dtype and shape) when given."""
    if dtype == torch.uint8:
        result = images.add_(0.5).clamp_(0, 255).to(torch.uint8).contiguous(memory_format=torch.channels_last)
    else:
        mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1) * 255.0
        std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1) * 255.0
        result = images.sub_(mean).div_(std).to(dtype).contiguous(memory_format=torch.channels_last)
    if out is None:
        return result
    out.copy_(result)
    return out
