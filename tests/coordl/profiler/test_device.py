"""The GPU path: the train step on a CUDA device, synchronized at each timed run's two
boundaries and nowhere else. Skipped when no GPU is present (the CPU side of the rule, no
synchronize on a CPU device, is test_profile.py::test_cpu_profile_never_synchronizes_cuda)."""

from __future__ import annotations

import pytest
import torch

import coordl
from coordl.profiler import profile

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


def test_cuda_profile_synchronizes_at_run_boundaries(tiny_root, monkeypatch):
    real = torch.cuda.synchronize
    calls = []

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        x = batch[0].cuda(non_blocking=True)[:, :, ::4, ::4].float() / 255
        loss = torch.nn.functional.cross_entropy(model(x), batch[1].cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    step(next(iter(coordl.DataLoader(coordl.ImageFolder(tiny_root, size=32), batch_size=4))))  # lazy init
    monkeypatch.setattr(torch.cuda, "synchronize", counting)
    r = profile(step, coordl.ImageFolder(tiny_root, size=32), batch_size=4, num_workers=1, steps=2,
                device="cuda", progress=False)
    # timed runs: ingestion, prep alone (1 worker), train all cached (1 worker), profiled
    assert len(calls) == 2 * 4
    assert r.settings["device"] == "cuda" and r.rates["ingestion"] > 0
