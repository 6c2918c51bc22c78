"""Interleaved per-file timing shared by bench/levers.py and bench/roi.py.

On a shared machine the noise moves within seconds, so every variant runs in
turn on the same chunk of files, `repeats` passes over all chunks, and a
ratio is only taken between variants timed a moment apart on the same files.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def sample_files(root: str, files: int) -> list[bytes]:
    """The bytes of `files` files spread evenly over the ImageFolder at `root`."""
    from coordl.manifest import scan

    m = scan(root)
    step = max(1, len(m) // files)
    raws = []
    for i in range(0, len(m), step)[:files]:
        with open(m.path(i), "rb") as f:
            raws.append(f.read())
    return raws


def interleaved(variants: dict[str, Callable[[int, bytes], object]], raws: list[bytes], chunk: int,
                repeats: int, base: str = "full-decode") -> tuple[dict, dict]:
    """(CPU ms per image of each chunk timing, per variant; their ratios to `base`, if timed)."""
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
    ref = times.get(base)
    ratios = {k: [a / b for a, b in zip(v, ref)] for k, v in times.items()} if ref else {}
    return times, ratios
