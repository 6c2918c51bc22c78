"""Built-in models for `coordl profile`, in plain torch (no torchvision), and their train step.

- ``small-cnn`` (the default): keeps every 4th pixel of each row and column
  (on the uint8 batch, before any float is made), then three strided
  convolutions and a linear layer: ~2 M multiply-adds per 224x224 image. On a
  CPU-only machine its step costs a fraction of the ~1.7 ms of CPU a JPEG
  decode + augment costs, so data loading, not the model, can be the
  bottleneck there: that is what the profiler is for.
- ``resnet18``: He et al.'s ResNet-18 (~1.8 G multiply-adds per image); on a
  CPU it is model-bound, on a GPU it is the usual data-stall benchmark.
- any other name: torchvision's model of that name (``resnet50``,
  ``vit_b_16``, ...: ``torchvision.models.get_model``, untrained) when
  torchvision is installed (``pip install 'coordl[torchvision]'``).

Both take the uint8 batch and normalize it themselves (on the device, as the
design says). A train step takes a batch as `coordl.DataLoader` gives it,
``[images uint8 (B, 3, H, W), labels int64 (B)]``, moves it to the device, runs
forward, backward and an SGD step, and returns the loss (a detached scalar).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from coordl.errors import ConfigError

_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class Normalize(nn.Module):
    """uint8 (B, 3, H, W) -> float, ImageNet mean and std."""

    mean: torch.Tensor  # buffers, registered below
    std: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().sub_(self.mean).div_(self.std)


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int, subsample: int = 4) -> None:
        super().__init__()
        self.subsample = subsample
        self.norm = Normalize()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.subsample
        return self.fc(self.features(self.norm(x[:, :, ::k, ::k])))


class _Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)), inplace=True)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.norm = Normalize()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [_Basic(cin, cout, stride), _Basic(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(self.norm(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS: dict[str, Callable[[int], nn.Module]] = {"small-cnn": SmallCNN, "resnet18": ResNet18}
DEFAULT_MODEL = "small-cnn"


def build(name: str, num_classes: int) -> nn.Module:
    """A built-in model, else torchvision's model of that name (``resnet50``, ``vit_b_16``, ...;
    untrained, `num_classes` outputs), with the uint8 normalization in front."""
    if name in MODELS:
        return MODELS[name](num_classes)
    return nn.Sequential(Normalize(), _torchvision_model(name, num_classes))


def _torchvision_model(name: str, num_classes: int) -> nn.Module:
    try:
        tvm: Any = importlib.import_module("torchvision.models")  # an optional extra: coordl[torchvision]
    except (ImportError, RuntimeError, OSError, AttributeError) as e:  # missing, or built for another torch
        raise ConfigError(
            f"model={name!r} is not a built-in model ({', '.join(MODELS)}), and torchvision models need "
            f"torchvision, which does not import here ({type(e).__name__}: {e}): pip install 'coordl[torchvision]' "
            "(a torchvision built for this torch), use a built-in model, or pass your own train step "
            "(--train-step module:function)") from None
    try:
        return tvm.get_model(name, weights=None, num_classes=num_classes)
    except (ValueError, KeyError) as e:
        known = getattr(tvm, "list_models", lambda: [])()
        raise ConfigError(
            f"model={name!r} is neither a built-in model ({', '.join(MODELS)}) nor a torchvision model ({e}): "
            f"pass one of {', '.join(MODELS)} or a torchvision name"
            + (f" ({', '.join(sorted(known)[:8])}, ...)" if known else " (resnet50, vit_b_16, ...)")) from None


def train_step_for(model: nn.Module, device: torch.device | str, lr: float = 0.01) -> Callable:
    """A train step for `model` (uint8 in) on `device`: forward, cross-entropy, backward, SGD."""
    device = torch.device(device)
    model = model.to(device).to(memory_format=torch.channels_last).train()  # pyright: ignore[reportCallIssue]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def train_step(batch) -> torch.Tensor:
        images, labels = batch[0], batch[1]
        logits = model(images.to(device, non_blocking=True))
        loss = F.cross_entropy(logits, labels.to(device, non_blocking=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return train_step
