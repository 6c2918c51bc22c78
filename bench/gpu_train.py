"""The stall bench: how fast a model trains when fed by each loader, against a batch already on the device.

    .venv/bin/python bench/gpu_train.py [ROOT] --model resnet50 --workers 14 --batch-size 256 --out OUT

Feeds, side by side in one run: ``synthetic`` (one batch already on the device: the model's own
rate), ``coordl-cpu`` (coordl's CPU pipeline in worker processes), ``coordl-gpu``
(``DataLoader(device=...)``: workers send bytes, the batch is decoded and augmented on the
device), ``torch`` (torch DataLoader + torchvision ImageFolder/transforms, when torchvision
imports) and ``dali`` (coordl's DALI backend, when DALI is installed). The model is any
torchvision model by name, or ``tiny`` (a small built-in CNN for CPU runs). Train step: SGD,
bf16 autocast on CUDA, channels_last.

Steady state only: the first ``workers * prefetch + warm-up`` batches are drained before the
window opens (none prefetched before it counts), and the window is at least 10 batches per
worker. Reported per feed: images/s, share of the synthetic rate, share of the window spent
waiting on data, CPU cores used (CPU time of this process and its children over wall time,
psutil) and peak GPU memory. ROOT (default /tmp/coordl-gpu-train) is an ImageFolder, made
with coordl's dataset maker when missing (``--images``). Writes OUT.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import psutil
import torch

FEEDS = ("synthetic", "coordl-cpu", "coordl-gpu", "torch", "dali")


def _tiny(classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(16, classes))


def _model(name: str, classes: int, device: torch.device) -> torch.nn.Module:
    if name == "tiny":
        model = _tiny(classes)
    else:
        import torchvision
        model = torchvision.models.get_model(name, num_classes=classes)
    return model.to(device, memory_format=torch.channels_last)


def _cpu_seconds() -> float:
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


class Trainer:
    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01)
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = (images.float() - self.mean) / self.std
        images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.as_tensor(labels).to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _loader(feed: str, a, device: torch.device):
    import coordl

    if feed in ("coordl-cpu", "coordl-gpu", "dali"):
        kw = {"device": str(device), "decoder": a.decoder} if feed == "coordl-gpu" else \
            {"backend": "dali", "dali_device": "gpu" if device.type == "cuda" else "cpu"} if feed == "dali" else {}
        return coordl.DataLoader(coordl.ImageFolder(a.root, "train", size=a.size), batch_size=a.batch_size,
                                 shuffle=True, num_workers=a.workers, persistent_workers=a.workers > 0,
                                 drop_last=True, pin_memory=device.type == "cuda" and feed == "coordl-cpu", **kw)
    import torchvision
    from torchvision import transforms as T

    tf = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.PILToTensor()])
    return torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(a.root, tf), batch_size=a.batch_size,
                                       shuffle=True, num_workers=a.workers, persistent_workers=a.workers > 0,
                                       drop_last=True, pin_memory=device.type == "cuda")


def _skip_reason(feed: str) -> str | None:
    import importlib.util
    if feed == "torch" and importlib.util.find_spec("torchvision") is None:
        return "torchvision is not installed"
    if feed == "dali" and importlib.util.find_spec("nvidia.dali") is None:
        return "DALI is not installed"
    return None


def _batches(loader):
    while True:
        yield from loader


def measure(feed: str, a, trainer: Trainer, device: torch.device) -> dict:
    drain = a.workers * 2 + a.warmup
    window = max(a.steps, 10 * max(a.workers, 1))
    if feed == "synthetic":
        images = torch.randint(0, 256, (a.batch_size, 3, a.size, a.size), dtype=torch.uint8, device=device)
        labels = torch.randint(0, a.classes, (a.batch_size,), device=device)
        source = iter(lambda: (images, labels), None)
    else:
        source = _batches(_loader(feed, a, device))
    for _ in range(drain):
        trainer.step(*next(source))
    trainer.sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    waited, images_done = 0.0, 0
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for _ in range(window):
        w0 = time.perf_counter()
        batch_images, batch_labels = next(source)
        waited += time.perf_counter() - w0
        trainer.step(batch_images, batch_labels)
        images_done += len(batch_labels)
    trainer.sync()
    wall = time.perf_counter() - t0
    return {"images_per_s": images_done / wall, "wait_share": waited / wall, "batches": window,
            "cpu_cores": (_cpu_seconds() - cpu0) / wall, "seconds": wall,
            "gpu_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def _table(results: dict) -> str:
    synth = results.get("synthetic", {}).get("images_per_s")
    lines = [f"{'feed':12s} {'images/s':>10s} {'of synth':>9s} {'waiting':>8s} {'cores':>6s} {'GPU GiB':>8s}"]
    for feed, r in results.items():
        if "skipped" in r:
            lines.append(f"{feed:12s} skipped: {r['skipped']}")
            continue
        share = f"{r['images_per_s'] / synth:.0%}" if synth else "-"
        mem = f"{r['gpu_mem_gib']:.1f}" if r["gpu_mem_gib"] is not None else "-"
        lines.append(f"{feed:12s} {r['images_per_s']:10.0f} {share:>9s} {r['wait_share']:8.0%} "
                     f"{r['cpu_cores']:6.1f} {mem:>8s}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", default="/tmp/coordl-gpu-train")
    p.add_argument("--model", default="resnet50", help="a torchvision model name, or 'tiny'")
    p.add_argument("--feeds", default=",".join(FEEDS), help=f"comma-separated, of {', '.join(FEEDS)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--decoder", default="auto", help="coordl-gpu's decoder: auto, nvimgcodec, torchvision, cpu")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--steps", type=int, default=50, help="batches in the window (at least 10 per worker)")
    p.add_argument("--warmup", type=int, default=5, help="batches trained before the window, after the drain")
    p.add_argument("--images", type=int, default=16000, help="images made when ROOT does not exist")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--out", default=None, help="write OUT.json")
    a = p.parse_args(argv)
    if not os.path.isdir(a.root):
        from coordl.cli.make_dataset import make_dataset
        make_dataset(a.root, images=a.images, classes=a.classes, seed=0, large_fraction=0.1, progress=False)
    a.classes = len([d for d in os.listdir(a.root) if os.path.isdir(os.path.join(a.root, d))])
    device = torch.device(a.device)
    results: dict = {}
    for feed in a.feeds.split(","):
        if feed not in FEEDS:
            sys.exit(f"--feeds: {feed!r} is not one of {', '.join(FEEDS)}")
        why = _skip_reason(feed)
        if why:
            results[feed] = {"skipped": why}
            continue
        trainer = Trainer(_model(a.model, a.classes, device), device)
        results[feed] = measure(feed, a, trainer, device)
        print(f"[{feed}] {results[feed]['images_per_s']:.0f} images/s", flush=True)
    report = {"model": a.model, "device": str(device), "batch_size": a.batch_size, "workers": a.workers,
              "root": a.root, "results": results}
    print(_table(results))
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
