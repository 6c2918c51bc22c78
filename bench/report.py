"""Facts and tables for the benchmarks: the machine, the dataset, versions, Markdown."""

from __future__ import annotations

import os
import platform
import statistics


def machine(cpus: list[int]) -> dict:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        pass
    return {"cpu_model": model, "cores_used": len(cpus), "cpu_ids": cpus,
            "cores_online": os.cpu_count(), "avx2": " avx2" in flags,
            "python": platform.python_version(), "kernel": platform.release()}


def dataset(root: str) -> dict:
    sizes = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.lower().endswith((".jpg", ".jpeg")):
                sizes.append(os.path.getsize(os.path.join(dirpath, name)))
    n = len(sizes)
    return {"root": os.path.abspath(root), "files": n,
            "mean_bytes": sum(sizes) / n if n else 0, "total_bytes": sum(sizes)}


def versions(children: dict | None = None) -> dict:
    import PIL
    import torch

    out = {"torch": torch.__version__, "pillow-simd (coordl, torch-simd, floor)": PIL.__version__}
    try:
        import nvidia.dali as dali

        out["dali"] = dali.__version__
    except ImportError:
        out["dali"] = None
    if children and "torch-pillow" in children:
        out["plain Pillow (torch-pillow)"] = children["torch-pillow"].ready.get("pil")
    import coordl

    out["coordl"] = coordl.__version__
    return out


def _rss_line(loader: dict) -> str:
    per = loader["rss_per_epoch"]
    if not per or not per[0]["workers"]:
        main = [e["main"] / 2**20 for e in per]
        return f"main {main[0]:.0f} -> {main[-1]:.0f} MiB"
    first, last = per[0]["workers"], per[-1]["workers"]
    text = ", ".join(f"{a / 2**20:.0f} -> {b / 2**20:.0f}" for a, b in zip(first, last)) + " MiB"
    if per[0].get("workers_private"):
        first, last = per[0]["workers_private"], per[-1]["workers_private"]
        text += " (private " + ", ".join(f"{a / 2**20:.0f} -> {b / 2**20:.0f}" for a, b in zip(first, last)) + ")"
    return text


def loaders_markdown(r: dict) -> str:
    m, d = r["machine"], r["dataset"]
    lines = [
        f"Machine: {m['cpu_model']}, {m['cores_used']} cores used (ids {m['cpu_ids']}), AVX2 {m['avx2']}.  ",
        f"Dataset: {d['root']}, {d['files']} files, mean {d['mean_bytes'] / 1024:.1f} KiB.  ",
        f"Batch {r['batch_size']}, {r['workers']} workers/threads, {r['repeats']} interleaved rounds "
        "after one warm-up epoch each.  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".  ",
        f"Command: `{r['command']}`",
        "",
        "images/s of a loader = images / (epoch seconds + CPU seconds it used between its epochs "
        "/ cores); floor = full-decode images/s on one core x cores. CPU ms/image = user+system "
        "CPU of the loader's process and its workers per image (less sensitive to other tenants "
        "than images/s). Worker RSS includes shared-memory batch buffers a worker keeps for reuse "
        "(coordl: at most prefetch_factor + 3 per worker, so it can grow by a few buffers until the "
        "pool is full); private = RssAnon, the worker's own memory.",
        "",
        "| loader | median images/s | min | max | coordl / this (median of per-round ratios) "
        "| CPU ms/image (all processes) | worker RSS first -> last epoch |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, lo in r["loaders"].items():
        ratio = r["ratios"].get(f"coordl/{name}")
        rtxt = (f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else "")
        label = name + (" (x cores)" if name == "floor" else "")
        cpu_ms = statistics.median(c / lo["images_per_epoch"] * 1e3 for c in lo["cpu_seconds"][1:])
        lines.append(f"| {label} | {lo['median']:.0f} | {lo['min']:.0f} | {lo['max']:.0f} | {rtxt} "
                     f"| {cpu_ms:.2f} | {_rss_line(lo)} |")
    return "\n".join(lines) + "\n"
