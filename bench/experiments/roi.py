"""Per-image CPU cost of coordl's `train` with and without the region-of-interest JPEG decoder.

    flock /tmp/coordl-bench.lock .venv/bin/python bench/experiments/roi.py /work/bench-data/photo \\
        --out bench/results/roi-photo

One core (pinned), bytes in memory, `time.process_time` per image (time lost
to other tenants of a shared machine is not counted). On a shared machine the
noise moves within seconds, so the variants run in turn on the same chunk of
25 files, `--repeats` passes over all chunks, and a ratio is only taken
between variants timed a moment apart on the same files.

  full-decode        Pillow: Image.open(bytes).load(), the floor
  full-decode (ext)  the _jpegroi extension decoding the whole image (libjpeg-turbo without Pillow)
  train (Pillow)     `cpu.train(roi=False)`: draft + stop below the crop (rows.py)
  train (ROI)        `cpu.train(roi=True)`: crop_scanline + skip_scanlines + DCT scaling
  ROI decode only    header + region decode of the same crop, no resize or copy
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for report.py
from lib import report  # noqa: E402


def sample_files(root: str, files: int) -> list[bytes]:
    """The bytes of `files` files spread evenly over the ImageFolder at `root`."""
    from coordl.manifest.build import scan

    m = scan(root)
    step = max(1, len(m) // files)
    raws = []
    for i in range(0, len(m), step)[:files]:
        with open(m.path(i), "rb") as f:
            raws.append(f.read())
    return raws


def interleaved(variants: dict[str, Callable[[int, bytes], object]], raws: list[bytes], chunk: int,
                repeats: int, base: str = "full-decode") -> tuple[dict, dict]:
    """(CPU ms per image of each chunk timing, per variant; their ratios to `base`)."""
    for fn in variants.values():  # warm-up
        for i, raw in enumerate(raws[:20]):
            fn(i, raw)
    chunks = [range(k, min(k + chunk, len(raws))) for k in range(0, len(raws), chunk)]
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for c in chunks:
            for k, fn in variants.items():
                t0 = time.process_time()
                for i in c:
                    fn(i, raws[i])
                times[k].append((time.process_time() - t0) / len(c) * 1e3)
    ref = times[base]
    return times, {k: [a / b for a, b in zip(v, ref)] for k, v in times.items()}


def variants(size: int = 224) -> dict:
    import io

    import numpy as np
    from PIL import Image

    from coordl.pipelines import cpu, crop, roi

    if not roi.AVAILABLE:
        sys.exit("coordl.pipelines._jpegroi is not built (bash install.sh)")
    out = np.empty((size, size, 3), np.uint8)

    def full(i, raw):
        with Image.open(io.BytesIO(raw)) as img:
            img.load()

    def full_ext(i, raw):
        w, h, _ok = roi.header(raw)
        roi._jpegroi.decode(raw, 1, 0, 0, w, h, 4)

    def train(use_roi):
        return lambda i, raw: cpu.train(raw, size, crop.item_rng(0, 0, i), out=out, roi=use_roi)

    def decode_only(i, raw):
        rng = crop.item_rng(0, 0, i)
        w, h, _ok = roi.header(raw)
        roi.decode_region(raw, crop.random_resized_crop_box(w, h, rng), size, (w, h), 4)

    return {"full-decode": full, "full-decode (ext)": full_ext, "train (Pillow)": train(False),
            "train (ROI)": train(True), "ROI decode only": decode_only}


def measure(root: str, files: int, repeats: int, cpu_id: int, chunk: int = 25) -> dict:
    import PIL

    from coordl.pipelines import roi

    os.sched_setaffinity(0, {cpu_id})
    raws = sample_files(root, files)
    times, ratios = interleaved(variants(), raws, chunk, repeats)
    return {"pil": PIL.__version__, "libjpeg": roi._jpegroi.version(), "files": len(raws), "chunk": chunk,
            "repeats": repeats, "ms_per_image": times, "ratio_to_full_decode": ratios}


def markdown(res: dict) -> str:
    lines = [f"Command: `{res['command']}`  ",
             f"{res['files']} files, one core, bytes in memory, CPU time per image; pillow-simd "
             f"{res['pil']}, libjpeg-turbo {res['libjpeg']}; variants interleaved on chunks of "
             f"{res['chunk']} files, {res['repeats']} passes; `cpu.train(roi=True/False)`. "
             "Ratio: median of per-chunk ratios.",
             "", "| variant | ms/image | images/s/core | time / full decode | time / train (Pillow) |",
             "|---|---:|---:|---:|---:|"]
    tp = res["ms_per_image"]["train (Pillow)"]
    for k, v in res["ms_per_image"].items():
        med = statistics.median(v)
        ratio = statistics.median(res["ratio_to_full_decode"][k])
        vs_train = statistics.median(a / b for a, b in zip(v, tp))
        lines.append(f"| {k} | {med:.3f} | {1000 / med:.0f} | {ratio:.2f} | {vs_train:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--files", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpu", type=int, default=None, help="CPU id (default: the first usable)")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    a = p.parse_args()
    cpu_id = a.cpu if a.cpu is not None else min(os.sched_getaffinity(0))
    res = {"command": report.command(), **measure(a.root, a.files, a.repeats, cpu_id)}
    report.write(a.out, res, markdown(res))


if __name__ == "__main__":
    main()
