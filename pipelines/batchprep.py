"""The batch path's two halves: plan an item where its bytes are, prepare the batch where it trains.

    plan = plan_item(raw, "train", 224, rng)         # worker: header, box, flip, region (no decode)
    prep = BatchPrep(open_decoder("auto", dev), 224, torch.uint8)
    got = prep.run(raws, plans)                      # training process: decode + crop/resize/flip

`plan_item` draws exactly what pipelines/cpu.py draws for the item, from the same generator in
the same order (`crop.random_resized_crop_box`, then `crop.flip`; `crop.center_crop_box` for
"val") and the size in the JPEG header, so a batch of this path has the CPU pipeline's boxes
and flips; only the resampling differs (pipelines/batchaug.py). It also refuses what the CPU
pipeline refuses before decoding (not an image, a broken header, over Pillow's pixel limit, a
marker inside a JPEG's image data, no end-of-image marker: pipelines/jpeghead.py) and decides
which decoder gets the file (`device_ok`).

`BatchPrep.run` decodes the batch's regions with the decoder in one call (pipelines/
batchdecode.py), gives what the decoder refused, or does not take at all, to the CPU decoder
(counted as fallbacks), and resamples every image at once. A file that cannot be decoded is
its own DecodeError in `Prepared.errors`; the rest of the batch goes on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from coordl.errors import DecodeError

from . import batchaug, crop, jpeghead
from . import cpu as cpu_pipeline
from . import roi as jpegroi
from .batchdecode import CpuDecoder, Decoded


@dataclass(frozen=True)
class ItemPlan:
    """What the training process needs to prepare one item, drawn where its bytes were read."""

    width: int
    height: int
    box: tuple[float, float, float, float]  # (left, top, width, height) in full-image pixels
    flip: bool
    region: tuple[int, int, int, int]       # (x0, y0, x1, y1): the pixels the resize of `box` reads
    device_ok: bool                         # a GPU JPEG decoder takes the file (else: the CPU decoder)


def plan_item(raw, transform: str, size: int | tuple[int, int], rng: random.Random | None) -> ItemPlan:
    """The item's box, flip and region, as pipelines/cpu.py draws them (`rng`: the item's
    `crop.item_rng`, unused for "val"); DecodeError for what the CPU pipeline refuses up front."""
    if jpeghead.is_jpeg(raw):
        head = jpeghead.read(raw)
        width, height, device_ok = head.width, head.height, head.device_ok
        cpu_pipeline.check_pixels(width, height)
        jpeghead.check(raw, head)
    else:
        width, height = cpu_pipeline.open_image(raw).size
        device_ok = False
    if transform == "train":
        if rng is None:
            raise ValueError("plan_item: transform='train' draws from the item's generator; pass rng")
        left, top, w, h = crop.random_resized_crop_box(width, height, rng)
        box = (float(left), float(top), float(w), float(h))
        flip = crop.flip(rng)
    else:
        box, flip = crop.center_crop_box(width, height, size), False
    return ItemPlan(width, height, box, flip, jpegroi.region_for_box(box, size, width, height), device_ok)


@dataclass
class Prepared:
    images: torch.Tensor | None          # (len(kept), 3, H, W) of the kept positions; None when none
    kept: list[int]                      # positions in the batch, in order
    errors: dict[int, DecodeError] = field(default_factory=dict)  # position -> why it was not decoded
    device_decodes: int = 0              # decoded by the batch decoder
    fallbacks: int = 0                   # given to the CPU decoder (refused, or not the decoder's format)


class BatchPrep:
    """Decode + crop + resize + flip of whole batches with `decoder` on its device (see the module)."""

    def __init__(self, decoder: Any, size: int | tuple[int, int], dtype: torch.dtype = torch.uint8) -> None:
        if dtype not in batchaug.OUT_DTYPES:
            raise ValueError(f"dtype={dtype}: use one of {batchaug.OUT_DTYPES}")
        self.decoder, self.size, self.dtype = decoder, crop.output_hw(size), dtype
        self.device = decoder.device
        self.fallback = decoder if isinstance(decoder, CpuDecoder) else CpuDecoder(self.device)

    def run(self, raws: list[Any], plans: list[ItemPlan], out: torch.Tensor | None = None) -> Prepared:
        """Prepare the batch; `out` ((len(raws), 3, H, W) of the output dtype) receives the kept
        images in its first rows when given (a pooled buffer), else a new tensor is made."""
        ondevice = [k for k, p in enumerate(plans) if p.device_ok]
        results: dict[int, Decoded | DecodeError | None] = {}
        if ondevice:
            got = self.decoder.decode([raws[k] for k in ondevice], [plans[k].region for k in ondevice])
            results.update(zip(ondevice, got))
        refused = [k for k in range(len(plans)) if results.get(k) is None]
        if refused:
            got = self.fallback.decode([raws[k] for k in refused], [plans[k].region for k in refused])
            results.update(zip(refused, got))
        kept = [k for k in range(len(plans)) if isinstance(results[k], Decoded)]
        errors = {k: r for k, r in results.items() if isinstance(r, DecodeError)}
        prepared = Prepared(None, kept, errors, len(ondevice) - len([k for k in refused if plans[k].device_ok]),
                            len(refused))
        if kept:
            prepared.images = self._augment([results[k] for k in kept], [plans[k] for k in kept], out)
        return prepared

    def _augment(self, decoded: list, plans: list[ItemPlan], out: torch.Tensor | None) -> torch.Tensor:
        padded, sizes = batchaug.pack([d.pixels for d in decoded])
        boxes = torch.tensor([(p.box[0] - d.x0, p.box[1] - d.y0, p.box[2], p.box[3])
                              for d, p in zip(decoded, plans)], dtype=torch.float64)
        flips = torch.tensor([p.flip for p in plans], dtype=torch.bool)
        images = batchaug.resize(padded, sizes, boxes, flips, self.size)
        return batchaug.finish(images, self.dtype, None if out is None else out[:len(decoded)])
