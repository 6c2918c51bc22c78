"""Per-image CPU cost of coordl's `train` with and without the region-of-interest JPEG decoder.

    flock /tmp/coordl-bench.lock .venv/bin/python bench/roi.py /work/bench-data/photo --out bench/results/roi-photo

One core (pinned), bytes in memory, `time.process_time` per image (time lost
to other tenants of the shared machine is not counted). The variants run on
the same files, interleaved on chunks of 25 files, `--repeats` passes; the
ratio is the median of per-chunk ratios to the full decode timed a moment
apart (as bench/levers.py).

  full-decode        Pillow: Image.open(bytes).load(), the floor of issue 3
  full-decode (ext)  the _jpegroi extension decoding the whole image (libjpeg-turbo without Pillow)
  train (Pillow)     coordl's train before the ROI decoder: draft + stop below the crop (rows.py)
  train (ROI)        coordl's train with pipelines/roi.py: crop_scanline + skip_scanlines + scale
  ROI decode only    header + region decode of the same crop, no resize or copy
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys

import timing


def variants(size: int = 224) -> dict:
    import io

    import numpy as np
    from PIL import Image

    from coordl.pipelines import cpu, crop, roi

    if not roi.AVAILABLE:
        sys.exit("coordl.pipelines._jpegroi is not built (bash install.sh)")
    out = np.empty((size, size, 3), np.uint8)
    integrated = "roi" in inspect.signature(cpu.train).parameters

    def full(i, raw):
        with Image.open(io.BytesIO(raw)) as img:
            img.load()

    def full_ext(i, raw):
        w, h, _ok = roi.header(raw)
        roi._jpegroi.decode(raw, 1, 0, 0, w, h, 4)

    def train_pillow(i, raw):
        kw = {"roi": False} if integrated else {}
        cpu.train(raw, size, crop.item_rng(0, 0, i), out=out, **kw)

    def train_roi_standalone(i, raw):  # what cpu.train does with the ROI decoder
        rng = crop.item_rng(0, 0, i)
        w, h, _ok = roi.header(raw)
        box = crop.random_resized_crop_box(w, h, rng)
        flip = crop.flip(rng)
        img, (left, top, bw, bh) = roi.region_image(raw, box, size, (w, h))
        small = img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + bw, top + bh))
        if flip:
            small = small.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.reshape(-1)[:] = np.frombuffer(small.tobytes("raw", "RGB"), np.uint8)

    def train_roi(i, raw):
        cpu.train(raw, size, crop.item_rng(0, 0, i), out=out, roi=True)

    def decode_only(i, raw):
        rng = crop.item_rng(0, 0, i)
        w, h, _ok = roi.header(raw)
        roi.decode_region(raw, crop.random_resized_crop_box(w, h, rng), size, (w, h), 4)

    return {"full-decode": full, "full-decode (ext)": full_ext, "train (Pillow)": train_pillow,
            "train (ROI)": train_roi if integrated else train_roi_standalone,
            "ROI decode only": decode_only}, integrated


def measure(root: str, files: int, repeats: int, cpu_id: int, chunk: int = 25) -> dict:
    import PIL

    from coordl.pipelines import roi

    os.sched_setaffinity(0, {cpu_id})
    raws = timing.sample_files(root, files)
    vs, integrated = variants()
    times, ratios = timing.interleaved(vs, raws, chunk, repeats)
    return {"pil": PIL.__version__, "libjpeg": roi._jpegroi.version(), "files": len(raws), "chunk": chunk,
            "repeats": repeats, "train_is_cpu_train": integrated, "ms_per_image": times,
            "ratio_to_full_decode": ratios}


def markdown(res: dict, command: str) -> str:
    how = ("`cpu.train(roi=True/False)`" if res["train_is_cpu_train"]
           else "`train (ROI)` = the same steps as cpu.train, written out here (not yet integrated)")
    lines = [f"Command: `{command}`  ",
             f"{res['files']} files, one core, bytes in memory, CPU time per image; pillow-simd "
             f"{res['pil']}, libjpeg-turbo {res['libjpeg']}; variants interleaved on chunks of "
             f"{res['chunk']} files, {res['repeats']} passes; {how}. Ratio: median of per-chunk ratios.",
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
    res = measure(a.root, a.files, a.repeats, cpu_id)
    command = " ".join([os.path.relpath(sys.executable), *sys.argv])
    table = markdown(res, command)
    print(table)
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump(res, f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
