"""coordl/profiler/networks.py: built-in models, and any torchvision model by name.

torchvision does not import on the CPU test machines, so its lookup is tested against a stand-in
package named torchvision (a real package on sys.path in a child interpreter, exposing
`torchvision.models.get_model` and `list_models`), not a mock of coordl's code."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from coordl.errors import ConfigError
from coordl.profiler import networks

STAND_IN = '''
import torch
from torch import nn

_MODELS = {"fakenet50": 8, "fake_vit": 4}
asked = []

def list_models():
    return sorted(_MODELS)

def get_model(name, **config):
    if name not in _MODELS:
        raise ValueError(f"Unknown model {name}")
    asked.append((name, config))
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, config["num_classes"]))
'''

CHILD = '''
import torch, torchvision.models as tvm
from coordl.errors import ConfigError
from coordl.profiler import networks
m = networks.build("fakenet50", 3)
step = networks.train_step_for(m, "cpu")
loss = step([torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8), torch.tensor([0, 2])])
assert loss.dim() == 0 and isinstance(m[0], networks.Normalize), m
print("asked", tvm.asked)
try:
    networks.build("nosuchnet", 3)
except ConfigError as e:
    print("error", e)
'''


def test_any_torchvision_model_by_name(tmp_path):
    pkg = tmp_path / "torchvision" / "models"
    pkg.mkdir(parents=True)
    (tmp_path / "torchvision" / "__init__.py").write_text("from . import models\n")
    (pkg / "__init__.py").write_text(STAND_IN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "asked [('fakenet50', {'weights': None, 'num_classes': 3})]" in p.stdout
    assert ("error model='nosuchnet' is neither a built-in model (small-cnn, resnet18) nor a torchvision model "
            "(Unknown model nosuchnet): pass one of small-cnn, resnet18 or a torchvision name (fake_vit, "
            "fakenet50, ...)") in p.stdout


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
def test_a_torchvision_name_without_torchvision_says_how_to_get_it():
    match = (r"model='resnet50' is not a built-in model \(small-cnn, resnet18\), and torchvision models need "
             r"torchvision.*pip install 'coordl\[torchvision\]'")
    with pytest.raises(ConfigError, match=match):
        networks.build("resnet50", 10)


def test_built_in_models_take_uint8():
    step = networks.train_step_for(networks.build("small-cnn", 4), "cpu")
    assert step([torch.zeros(2, 3, 32, 32, dtype=torch.uint8), torch.tensor([0, 3])]).dim() == 0
