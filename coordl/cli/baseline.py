"""The baseline users compare against: a Dataset written the way a torchvision
user writes it (Pillow open + convert("RGB"), crop, resize, flip, to tensor),
for `torch.utils.data.DataLoader`. Used by `coordl demo` and bench/; it shares
no code path with coordl's pipeline except the crop-parameter sampling (which
costs microseconds).
"""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image

from coordl.manifest.build import scan
from coordl.pipelines import crop


class TorchvisionStyleFolder(torch.utils.data.Dataset):
    """ImageFolder + RandomResizedCrop(size) + RandomHorizontalFlip + PILToTensor."""

    def __init__(self, root: str, size: int = 224, transform: str = "train") -> None:
        self.manifest = scan(root)
        self.size, self.transform = size, transform
        self.rng = random.Random()  # unseeded, as torchvision draws from the global RNG

    def __len__(self) -> int:
        return len(self.manifest)

    def __getitem__(self, i: int):
        with open(self.manifest.path(i), "rb") as f:
            img = Image.open(f).convert("RGB")
        s = self.size
        if self.transform == "train":
            left, top, w, h = crop.random_resized_crop_box(*img.size, self.rng)
            img = img.crop((left, top, left + w, top + h)).resize((s, s), Image.Resampling.BILINEAR)
            if self.rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            short = min(img.size)
            r = int(s / crop.VAL_RESIZE_RATIO)
            img = img.resize((r * img.size[0] // short, r * img.size[1] // short), Image.Resampling.BILINEAR)
            left, top = (img.size[0] - s) // 2, (img.size[1] - s) // 2
            img = img.crop((left, top, left + s, top + s))
        tensor = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)
        return tensor, int(self.manifest.labels[i])


def worker_init_fn(worker_id: int) -> None:
    """Give each worker its own augmentation stream (as torchvision's torch RNG does)."""
    info = torch.utils.data.get_worker_info()
    if info is None:  # called outside a worker: nothing to seed
        return
    setattr(info.dataset, "rng", random.Random(f"{torch.initial_seed()}/{worker_id}"))  # noqa: B010 (typed Dataset)
