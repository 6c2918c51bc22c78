"""How test_resume.py and resume_job.py build the same loader from a JSON config."""

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
