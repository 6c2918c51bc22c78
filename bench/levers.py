"""Per-image cost of each lever of the CPU pipeline, one core, bytes already in memory.

    .venv/bin/python bench/levers.py /work/bench-data/photo --out bench/results/levers-photo

Variants run on the same files, interleaved round by round (A B C ... x
`--repeats`), pinned to one CPU; the median per-image CPU time
(`time.process_time`, so time lost to other tenants of a shared machine is
not counted) is reported
with its ratio to the full decode (the floor). The script runs itself a
second time with plain Pillow first on sys.path (`--pil-path`) for the rows
marked "plain Pillow", so both builds are measured in one run.

Variants, each adding one lever to the one above it:

  full-decode            Image.open(bytes).load(): the floor
  tv-style               decode, convert RGB, crop, resize, flip, np.array (the torch baseline's work)
  one-pass               decode, then one resize(box=crop) (crop+resize fused), flip in the copy out
  one-pass+draft         + DCT-scaled decode (Image.draft) when the crop allows
  one-pass+draft+partial + stop decoding below the crop (pipelines/rows.py): coordl's train
  ...+reducing_gap=2/3   Pillow's reduce-then-resize, measured for comparison
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time

import timing

HERE = os.path.dirname(os.path.abspath(__file__))
PLAIN_PILLOW = os.path.join(os.path.dirname(HERE), ".venv", "plain-pillow")


def variants(size: int = 224) -> dict:
    import numpy as np
    from PIL import Image

    from coordl.pipelines import cpu, crop

    bilinear = Image.Resampling.BILINEAR

    def full(i, raw):
        with Image.open(io.BytesIO(raw)) as img:
            img.load()

    def tv_style(i, raw):
        rng = crop.item_rng(0, 0, i)
        img = Image.open(io.BytesIO(raw)).convert("RGB")
        left, top, w, h = crop.random_resized_crop_box(*img.size, rng)
        img = img.crop((left, top, left + w, top + h)).resize((size, size), bilinear)
        if crop.flip(rng):
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.array(img, dtype=np.uint8)

    out = np.empty((size, size, 3), np.uint8)

    def coordl(draft, partial):
        return lambda i, raw: cpu.train(raw, size, crop.item_rng(0, 0, i), out=out,
                                        draft=draft, partial=partial)

    def gap(g):
        def run(i, raw):
            rng = crop.item_rng(0, 0, i)
            img = cpu.open_image(raw)
            box = crop.random_resized_crop_box(*img.size, rng)
            flip = crop.flip(rng)
            box = cpu._draft(img, box, size)
            img = cpu._decode_for(img, raw, box, size, True)
            left, top, w, h = box
            small = img.resize((size, size), bilinear, box=(left, top, left + w, top + h),
                               reducing_gap=g)
            if flip:
                small = small.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            out.reshape(-1)[:] = np.frombuffer(small.tobytes(), np.uint8)
        return run

    return {
        "full-decode": full,
        "tv-style": tv_style,
        "one-pass": coordl(False, False),
        "one-pass+draft": coordl(True, False),
        "one-pass+draft+partial": coordl(True, True),
        "...+reducing_gap=2": gap(2.0),
        "...+reducing_gap=3": gap(3.0),
    }


def copy_costs(size: int = 224, n: int = 3000) -> dict:
    """Microseconds of each way to get a resized PIL image into the batch buffer."""
    import numpy as np
    from PIL import Image

    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (size, size, 3), np.uint8))
    out = np.empty((size, size, 3), np.uint8)
    ops = {
        "tobytes": lambda: img.tobytes(),
        "tobytes+copy into batch": lambda: out.__setitem__(
            Ellipsis, np.frombuffer(img.tobytes(), np.uint8).reshape(size, size, 3)),
        "tobytes+flipped copy into batch": lambda: out.__setitem__(
            Ellipsis, np.frombuffer(img.tobytes(), np.uint8).reshape(size, size, 3)[:, ::-1]),
        "PIL transpose+tobytes+copy": lambda: out.__setitem__(Ellipsis, np.frombuffer(
            img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).tobytes(), np.uint8).reshape(size, size, 3)),
        "np.asarray (array interface)": lambda: np.asarray(img),
    }
    res = {}
    for name, op in ops.items():
        t0 = time.process_time()
        for _ in range(n):
            op()
        res[name] = (time.process_time() - t0) / n * 1e6
    return res


def measure(root: str, files: int, repeats: int, cpu_id: int, only: list[str] | None,
            chunk: int = 25) -> dict:
    os.sched_setaffinity(0, {cpu_id})
    raws = timing.sample_files(root, files)
    vs = {k: v for k, v in variants().items() if not only or k in only}
    times, ratios = timing.interleaved(vs, raws, chunk, repeats)
    import PIL

    return {"pil": PIL.__version__, "files": len(raws), "chunk": chunk, "ms_per_image": times,
            "ratio_to_full_decode": ratios, "copy_us": copy_costs()}


def markdown(simd: dict, plain: dict, command: str) -> str:
    lines = [f"Command: `{command}`  ", f"{simd['files']} files, one core, bytes in memory, CPU time per image; "
             f"variants interleaved on chunks of {simd['chunk']} files; medians over "
             f"{len(simd['ms_per_image']['full-decode'])} chunk timings. The ratio is the median of "
             "per-chunk ratios to the full decode of the same build, timed a moment apart.", "",
             "| variant | Pillow build | ms/image | images/s/core | time / full decode |",
             "|---|---|---:|---:|---:|"]
    for label, res in (("pillow-simd " + simd["pil"], simd), ("plain Pillow " + plain["pil"], plain)):
        if not res:
            continue
        for k, v in res["ms_per_image"].items():
            med = statistics.median(v)
            ratio = statistics.median(res["ratio_to_full_decode"][k])
            lines.append(f"| {k} | {label} | {med:.3f} | {1000 / med:.0f} | {ratio:.2f} |")
    lines += ["", "Copying a resized 224x224 image into the batch buffer (pillow-simd), microseconds:",
              "", "| operation | us |", "|---|---:|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in simd["copy_us"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--files", type=int, default=600)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cpu", type=int, default=None, help="CPU id (default: the first usable)")
    p.add_argument("--pil-path", default=None, help="(internal) run with this PIL first on sys.path")
    p.add_argument("--only", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cpu_id = a.cpu if a.cpu is not None else min(os.sched_getaffinity(0))
    only = a.only.split(",") if a.only else None
    if a.pil_path:
        sys.path.insert(0, a.pil_path)
        print(json.dumps(measure(a.root, a.files, a.repeats, cpu_id, only)))
        return
    plain_cmd = [sys.executable, __file__, a.root, "--files", str(a.files), "--repeats",
                 str(a.repeats), "--cpu", str(cpu_id), "--pil-path", PLAIN_PILLOW,
                 "--only", "full-decode,tv-style,one-pass,one-pass+draft+partial"]
    plain = json.loads(subprocess.run(plain_cmd, check=True, capture_output=True, text=True).stdout)
    if ".post" in plain["pil"]:
        sys.exit(f"the plain-Pillow run imported {plain['pil']}: install plain Pillow into {PLAIN_PILLOW}")
    simd = measure(a.root, a.files, a.repeats, cpu_id, only)
    command = " ".join([os.path.relpath(sys.executable), *sys.argv])
    table = markdown(simd, plain, command)
    print(table)
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump({"command": command, "simd": simd, "plain": plain}, f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
