"""Summarise a py-spy raw (collapsed-stack) profile: share of samples per stage.

Each line of py-spy's raw format is ``frame;frame;...;leaf COUNT``. A sample
goes to the stage of its leaf-most frame that matches a stage's pattern, so
a memcpy inside Pillow's resize counts as resize, a libjpeg frame as decode.
"""

from __future__ import annotations

import collections
import sys

STAGES = [
    ("JPEG decode (libjpeg-turbo: entropy, IDCT, colour)", ("libjpeg", "ImagingJpegDecode",
                                                            "top_rows (", "load (PIL/ImageFile")),
    ("resize crop -> 224 (pillow-simd)", ("ImagingResample", "_resize (_imaging", "resize (PIL/")),
    ("flip + tobytes + copy into batch", ("ImagingTranspose", "transpose (", "tobytes (",
                                          "_resize_into (")),
    ("Image.open (header parse)", ("open (PIL/Image.py", "JpegImagePlugin", "open_image (")),
    ("augmentation RNG + crop box", ("item_rng (", "random_resized_crop_box (", "flip (pipelines")),
    ("file read", ("read_file (",)),
    ("batch buffer in shared memory", ("_alloc_batch (", "_new_shared", "WorkerBuffers.", "new_shared (")),
    ("counters", ("Counters.",)),
    ("coordl glue (prep, __getitems__)", ("ImageFolder.", "train (pipelines", "_decode_for (")),
    ("main process: receive batches", ("_next_data (", "_get_data (", "_try_get_data (", "Lender.",
                                       "rebuild_storage", "__next__ (torch")),
    ("torch worker loop, queues, pickling", ("_worker_loop (", "multiprocessing/", "pickle",
                                             "ForkingPickler", "collate")),
    ("start-up (imports, fork, gc at start)", ("_compile_bytecode", "_find_and_load", "<module>",
                                               "_bootstrap")),
]


def stage_of(stack: str) -> str:
    """The stage of the leaf-most frame that matches one (native leaves inherit their caller's)."""
    for frame in reversed(stack.split(";")):
        for name, pats in STAGES:
            if any(p in frame for p in pats):
                return name
    return "other: " + stack.rsplit(";", 1)[-1][:60]


def summarise(path: str, only: str | None = "_worker_loop (") -> list[tuple[str, int]]:
    """Samples per stage, counting only stacks that contain `only` (default: loader workers,
    i.e. the steady-state per-image work, not start-up or the idle main process)."""
    counts: collections.Counter[str] = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if n.isdigit() and (only is None or only in stack):
                counts[stage_of(stack)] += int(n)
    return counts.most_common()


def main() -> None:
    rows = summarise(sys.argv[1], None if "--all" in sys.argv else "_worker_loop (")
    total = sum(n for _, n in rows)
    print("| stage | samples | share |\n|---|---:|---:|")
    shown = 0
    for name, n in rows:
        if shown < 18:
            print(f"| {name} | {n} | {n / total:.1%} |")
            shown += 1
    print(f"| (total) | {total} | 100% |")


if __name__ == "__main__":
    main()
