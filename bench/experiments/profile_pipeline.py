"""Where the time per image goes in coordl's `train` pipeline (cProfile, one core).

    .venv/bin/python bench/experiments/profile_pipeline.py /work/bench-data/photo --out bench/results/profile-photo

Runs `ImageFolder.fetch` + `prep` (what a worker does per item, minus the
batch bookkeeping) over `--files` items under cProfile, then groups the
functions' own time (tottime) into stages and prints microseconds per image.
A stage is the C call that does the work, so Python overhead around it lands
in "python glue".
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for report.py
from lib import report  # noqa: E402

# (stage, predicate on (file, function name)), first match wins
STAGES = [
    ("entropy decode + IDCT + colour (libjpeg-turbo)", lambda f, n: "ImagingDecoder" in n and "decode" in n
     or "_jpegroi.decode" in n),
    ("resize crop -> 224 (bilinear, antialiased)", lambda f, n: "ImagingCore" in n and "resize" in n),
    ("copy out (tobytes, numpy copy + flip)", lambda f, n: "tobytes" in n or "ImagingEncoder" in n
     or n.endswith("encode}") or "frombuffer" in n),
    ("read file (storage)", lambda f, n: "read_file" in n or "io.open" in n or "posix.read" in n
     or ".read of" in n or "readinto" in n or "fadvise" in n or "posix.open" in n),
    ("JPEG header parse (Image.open, _jpegroi.header)", lambda f, n: "_jpegroi.header" in n
     or "JpegImagePlugin" in f or "ImageFile" in f
     or "Image.py" in f and "open" in n or "_open" in n),
    ("augmentation RNG + crop box (random.Random)", lambda f, n: "item_rng" in n or "random_resized_crop_box" in n
     or "Generator" in n or "uniform" in n or "integers" in n or "random" in n),
    ("new image buffers (Image.core.new/fill)", lambda f, n: "core.fill" in n or "core.new" in n
     or "built-in method fill" in n or "built-in method new" in n),
]


def stage_of(func: tuple) -> str:
    file, _line, name = func
    for stage, pred in STAGES:
        if pred(file, name):
            return stage
    return "python glue (coordl + Pillow Python code)"


def run(root: str, files: int, cpu_id: int) -> dict:
    import coordl

    os.sched_setaffinity(0, {cpu_id})
    ds = coordl.ImageFolder(root, "train")
    idx = list(range(0, len(ds), max(1, len(ds) // files)))[:files]
    import numpy as np

    out = np.empty((ds.size, ds.size, 3), np.uint8)
    for i in idx[:20]:
        ds.prep_into(ds.fetch(i), i, 0, out)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in idx:
        ds.prep_into(ds.fetch(i), i, 0, out)
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    stages: dict[str, float] = {}
    top = []
    for func, (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        s = stage_of(func)
        stages[s] = stages.get(s, 0.0) + tt
        top.append((tt, f"{os.path.basename(func[0])}:{func[2]}"))
    top.sort(reverse=True)
    n = len(idx)
    return {"files": n, "wall_us_per_image_profiled": wall / n * 1e6,
            "stages_us": {k: v / n * 1e6 for k, v in sorted(stages.items(), key=lambda kv: -kv[1])},
            "top_functions_us": [(name, tt / n * 1e6) for tt, name in top[:15]]}


def markdown(r: dict) -> str:
    total = sum(r["stages_us"].values())
    lines = [f"Command: `{r['command']}`  ", f"{r['files']} items, one core, cProfile on (adds overhead to "
             f"Python calls); {r['wall_us_per_image_profiled']:.0f} us/image profiled.", "",
             "| stage | us/image | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.0f} | {v / total:.0%} |" for k, v in r["stages_us"].items()]
    lines += ["", "Top functions by own time (us/image):", "", "| function | us |", "|---|---:|"]
    lines += [f"| `{name}` | {us:.1f} |" for name, us in r["top_functions_us"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--files", type=int, default=600)
    p.add_argument("--cpu", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cpu_id = a.cpu if a.cpu is not None else min(os.sched_getaffinity(0))
    r = {"command": report.command(), **run(a.root, a.files, cpu_id)}
    report.write(a.out, r, markdown(r))


if __name__ == "__main__":
    main()
