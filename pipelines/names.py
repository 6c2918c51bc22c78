"""The names the pipelines know: their transforms and DALI's devices (coordl/names.py re-exports them)."""

from __future__ import annotations

#: the built-in augmentations: "train" (RandomResizedCrop + flip), "val" (resize + center crop)
TRANSFORMS = ("train", "val")
#: where DALI decodes: "cpu" (its host decoder), "gpu" (nvJPEG and GPU resize)
DALI_DEVICES = ("cpu", "gpu")
