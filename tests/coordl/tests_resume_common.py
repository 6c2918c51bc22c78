"""How test_resume.py and resume_job.py build the same loader from a JSON config, and how the
tests run resume_job.py in a fresh process."""

import json
import os
import subprocess
import sys

import torch
from torch.utils.data import TensorDataset

import coordl


def build(config: dict):
    if config.get("tensor"):
        data = TensorDataset(torch.arange(37 * 3, dtype=torch.float32).view(37, 3), torch.arange(37))
        gen = torch.Generator().manual_seed(config["generator"]) if "generator" in config else None
        return coordl.DataLoader(data, batch_size=config["batch_size"], shuffle=True, generator=gen,
                                 num_workers=config.get("workers", 0))
    ds = coordl.ImageFolder(config["root"], transform="train", size=24, seed=config.get("seed", 0))
    return coordl.DataLoader(
        ds, batch_size=config["batch_size"], shuffle=True, num_workers=config["workers"],
        persistent_workers=config.get("persistent", False), cache=config.get("cache"),
        rank=config.get("rank", 0), world_size=config.get("world_size", 1))


def resume_in_fresh_process(tmp_path, config: dict, states: list, name: str = "run") -> list:
    """resume_job.py (a new interpreter: nothing of this process's state) resuming each of
    `states` (through JSON) with a loader built from `config`; what it read, per state."""
    here = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / f"{name}.config.json").write_text(json.dumps(config))
    (tmp_path / f"{name}.states.json").write_text(json.dumps(states))
    out = tmp_path / f"{name}.pt"
    proc = subprocess.run([sys.executable, os.path.join(here, "resume_job.py"), str(tmp_path / f"{name}.config.json"),
                           str(tmp_path / f"{name}.states.json"), str(out)], capture_output=True, text=True,
                          timeout=240, env=dict(os.environ, PYTHONPATH=here))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=True)
