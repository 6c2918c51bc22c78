"""setup.cfg says what is true: one version, a torch floor coordl really needs."""

import configparser
import importlib.metadata
import inspect
import os

import torch
from packaging.requirements import Requirement
from setuptools.config.setupcfg import read_configuration

import coordl
import coordl._version

SETUP_CFG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.cfg")


def test_version_lives_in_one_place():
    raw = configparser.ConfigParser()
    raw.read(SETUP_CFG)
    assert raw["metadata"]["version"] == "attr: coordl._version.__version__"
    built = read_configuration(SETUP_CFG)["metadata"]["version"]
    assert built == coordl._version.__version__ == coordl.__version__
    assert importlib.metadata.version("coordl") == built, "the installed metadata is stale: pip install -e ."


def test_torch_floor_has_what_the_loader_passes():
    reqs = [Requirement(r) for r in read_configuration(SETUP_CFG)["options"]["install_requires"]]
    torch_req = next(r for r in reqs if r.name == "torch")
    assert str(torch_req.specifier) == ">=2.6"
    assert torch_req.specifier.contains(torch.__version__.split("+")[0])
    # in_order is new in torch 2.6; coordl.DataLoader passes it through
    assert "in_order" in inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    assert "in_order" in inspect.signature(coordl.DataLoader.__init__).parameters
