"""coordl.WebDataset against webdataset's own loader on the same tar shards: throughput and shuffle quality.

    .venv/bin/python bench/webdataset.py --data $BENCH_DATA/wds --images 2000 --per-shard 100 \
        --out bench/results/webdataset

Makes (once) an ImageFolder of `--images` JPEGs with `coordl make-dataset`'s generator, and tars
it into WebDataset shards of `--per-shard` samples (``<class>/<stem>.jpg`` + ``.cls``, in the
ImageFolder's order). Then two loaders over the same shards, workers, batch size and "train"
recipe (RandomResizedCrop + flip to `--size`, uint8 CHW):

  coordl       coordl.DataLoader(coordl.WebDataset(pattern, transform="train"), shuffle=True):
               coordl's exact global shuffle, item-level preads, region decoder
  webdataset   wds.WebDataset(pattern, shardshuffle=--shard-buffer).shuffle(--buffer).decode("pil")
               -> the same crop/flip in Pillow (torchvision-style), wds.WebLoader: a shard-order
               shuffle and a shuffle buffer, the loader webdataset documents

Each is warmed up by one epoch, then `--rounds` epochs each, interleaved. Reported: images/s
(median of rounds) and the shuffle quality of the sample stream the training loop sees: the
fraction of consecutive samples that come from the same shard (a uniform shuffle gives about
sum((n_s/N)^2), ~1/shards; a buffer shuffle much more), measured over every measured epoch.
On a shared machine the figures are noisy: compare rows of one run.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
import tarfile
import time

import numpy as np
import torch

# This file is bench/webdataset.py: running it puts bench/ first on sys.path, where `import
# webdataset` would find this script again; webdataset (the package) is imported without it.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
import webdataset as wds  # noqa: E402

sys.path.insert(0, HERE)
from lib import report  # noqa: E402

import coordl  # noqa: E402
from coordl.cli.make_dataset import make_dataset  # noqa: E402
from coordl.manifest.build import scan  # noqa: E402
from coordl.pipelines import crop  # noqa: E402


def write_shards(root: str, out_dir: str, per_shard: int) -> tuple[str, list[str]]:
    """The ImageFolder at `root` in manifest order as WebDataset shards: (brace pattern, paths)."""
    m = scan(root, manifest_cache="off")
    count = (len(m) + per_shard - 1) // per_shard
    paths = [os.path.join(out_dir, f"train-{s:06d}.tar") for s in range(count)]
    pattern = os.path.join(out_dir, f"train-{{000000..{count - 1:06d}}}.tar")
    if all(os.path.exists(p) for p in paths):
        return pattern, paths
    os.makedirs(out_dir, exist_ok=True)
    for s, path in enumerate(paths):
        with tarfile.open(path + ".tmp", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * per_shard, min(len(m), (s + 1) * per_shard)):
                key = os.path.splitext(os.path.relpath(m.path(i), m.root))[0]
                tar.add(m.path(i), arcname=key + ".jpg")
                label = str(int(m.labels[i])).encode()
                info = tarfile.TarInfo(key + ".cls")
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
        os.replace(path + ".tmp", path)
    return pattern, paths


class _PilTrain:
    """RandomResizedCrop + horizontal flip in Pillow, as coordl.cli.baseline does, per worker RNG."""

    def __init__(self, size: int) -> None:
        self.size, self.rng = size, None

    def __call__(self, img):
        from PIL import Image

        if self.rng is None:
            info = torch.utils.data.get_worker_info()
            self.rng = random.Random(f"{torch.initial_seed()}/{info.id if info else 0}")
        img = img.convert("RGB")
        left, top, w, h = crop.random_resized_crop_box(*img.size, self.rng)
        img = img.crop((left, top, left + w, top + h)).resize((self.size, self.size), Image.Resampling.BILINEAR)
        if self.rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)


def _same_shard_fraction(shards: list[int]) -> float:
    pairs = len(shards) - 1
    return sum(a == b for a, b in zip(shards, shards[1:])) / pairs if pairs > 0 else 0.0


def make_coordl(pattern: str, a):
    ds = coordl.WebDataset(pattern, transform="train", size=a.size)
    loader = coordl.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                               persistent_workers=a.workers > 0)
    state = {"epoch": 0}

    def epoch() -> tuple[int, list[int]]:
        n = sum(len(y) for _, y in loader)
        order = loader.epoch_indices(state["epoch"])
        state["epoch"] += 1
        return n, [int(ds.index.shard[i]) for i in order]

    return epoch, ds


def make_webdataset(pattern: str, shard_of: dict[str, int], a):
    ds = (wds.WebDataset(pattern, shardshuffle=a.shard_buffer, empty_check=False)
          .shuffle(a.buffer).decode("pil").to_tuple("jpg", "cls", "__url__")
          .map_tuple(_PilTrain(a.size), int, lambda u: shard_of[u]))
    loader = wds.WebLoader(ds, batch_size=a.batch_size, num_workers=a.workers,
                           persistent_workers=a.workers > 0)

    def epoch() -> tuple[int, list[int]]:
        n, shards = 0, []
        for _, y, s in loader:
            n += len(y)
            shards.extend(int(v) for v in s)
        return n, shards

    return epoch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder for the generated ImageFolder and shards")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-shard", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--buffer", type=int, default=1000, help="webdataset's shuffle buffer")
    p.add_argument("--shard-buffer", type=int, default=100, help="webdataset's shard-order shuffle buffer")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="write OUT.json + OUT.md")
    a = p.parse_args()

    root = os.path.join(a.data, "images")
    if not os.path.isdir(root):
        make_dataset(root, images=a.images, classes=a.classes, progress=False)
    pattern, paths = write_shards(root, os.path.join(a.data, f"shards-{a.per_shard}"), a.per_shard)
    shard_of = {p: s for s, p in enumerate(paths)}
    epoch_c, ds = make_coordl(pattern, a)
    epoch_w = make_webdataset(pattern, shard_of, a)
    sizes = np.bincount(ds.index.shard, minlength=len(paths))
    uniform = float(((sizes / sizes.sum()) ** 2).sum())

    rows = {"coordl": {"rates": [], "same": []}, "webdataset": {"rates": [], "same": []}}
    for epoch in (epoch_c, epoch_w):
        epoch()  # warm-up: workers started, index built, page cache warm for both
    for _ in range(a.rounds):
        for name, epoch in (("coordl", epoch_c), ("webdataset", epoch_w)):
            t = time.perf_counter()
            n, shards = epoch()
            rows[name]["rates"].append(n / (time.perf_counter() - t))
            rows[name]["same"].append(_same_shard_fraction(shards))
            rows[name]["images"] = n
    result = {"command": report.command(), "machine": report.machine(sorted(os.sched_getaffinity(0))),
              "versions": report.versions(), "images": len(ds), "shards": len(paths),
              "batch_size": a.batch_size, "workers": a.workers, "size": a.size, "buffer": a.buffer,
              "uniform_same_shard": uniform, "loaders": {}}
    lines = [f"# coordl.WebDataset vs webdataset ({len(ds)} images in {len(paths)} shards, batch "
             f"{a.batch_size}, {a.workers} workers, size {a.size}, webdataset buffer {a.buffer})", "",
             "| loader | images/s (median) | min | max | same-shard consecutive pairs |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        same = statistics.mean(r["same"])
        result["loaders"][name] = {"images_per_s": statistics.median(r["rates"]), "rates": r["rates"],
                                   "same_shard_fraction": same, "images_per_epoch": r["images"]}
        lines.append(f"| {name} | {statistics.median(r['rates']):.0f} | {min(r['rates']):.0f} | "
                     f"{max(r['rates']):.0f} | {same:.3f} |")
    lines += ["", f"A uniform shuffle gives {uniform:.3f} (sum of (shard share)^2). Noisy shared machine: "
              "compare rows of one run.", "", f"`{result['command']}`"]
    report.write(a.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()
