"""What every benchmark writes: its result as OUT.json + OUT.md, and the facts of the run.

A benchmark builds one JSON-able dict and one Markdown text, then

    report.write(a.out, result, markdown)    # prints the Markdown; with --out, OUT.json + OUT.md

and records where it ran with ``report.machine(cpus)``, ``report.dataset(root)``,
``report.versions()`` and ``report.command()``. A result file must not name this
machine: paths inside the repository are written relative to it, any other path
as ``$BENCH_DATA/<its last part>`` (the folder ``coordl make-dataset`` wrote the
datasets into; ``$OUT_DIR`` for an ``--out`` outside the repository), and `write`
warns about a machine path or a host name left in the text
(tests/bench/test_bench_smoke.py checks the committed results).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import socket
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "$BENCH_DATA"
# absolute paths a result file must not carry (its author's checkout, data and temp folders)
MACHINE_PATH = re.compile(r"(?<![\w.$])/(?:work|tmp|root|home|mnt|scratch|data)/")


def portable(path: str, outside: str = DATA) -> str:
    """`path` as a result file names it: relative inside the repository, else `<outside>/<last part>`."""
    full = os.path.abspath(path)
    if full == REPO or full.startswith(REPO + os.sep):
        return os.path.relpath(full, REPO)
    return f"{outside}/{os.path.basename(full.rstrip(os.sep))}"


def command(argv: list[str] | None = None) -> str:
    """The command line of this run, portable: `.venv/bin/python bench/x.py ARGS`.

    An absolute path argument goes through `portable`; the value of `--out`
    outside the repository becomes `$OUT_DIR/<name>`.
    """
    argv = sys.argv if argv is None else argv
    words = [portable(sys.executable), portable(argv[0])]
    for prev, w in zip(argv, argv[1:]):
        words.append(portable(w, "$OUT_DIR" if prev == "--out" else DATA) if os.path.isabs(w) else w)
    return " ".join(w if w.startswith("$") else shlex.quote(w) for w in words)


def leaks(text: str) -> list[str]:
    """The machine paths and host names in `text` (a result file should have none)."""
    found = [m.group(0) for m in MACHINE_PATH.finditer(text)]
    host = socket.gethostname()
    if len(host) >= 4 and re.search(rf"\b{re.escape(host)}\b", text):
        found.append(host)
    return found


def write(out: str | None, result: dict, markdown: str, echo: bool = True) -> None:
    """Print `markdown` (unless `echo=False`); with `out`, write OUT.json (`result`) and OUT.md."""
    if echo:
        print("\n" + markdown, flush=True)
    if not out:
        return
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    text = json.dumps(result, indent=1)
    with open(out + ".json", "w") as f:
        f.write(text + "\n")
    with open(out + ".md", "w") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    bad = sorted(set(leaks(text + markdown)))
    if bad:
        print(f"warning: {out}.json/.md name this machine ({', '.join(bad)}): record report.portable() "
              "paths before committing them", file=sys.stderr)
    print(f"wrote {out}.json and {out}.md", flush=True)


def _cpuinfo(prefix: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith(prefix)), "")
    except OSError:
        return ""


def machine(cpus: list[int]) -> dict:
    """The CPU the run used (no host name: results are shared)."""
    return {"cpu_model": _cpuinfo("model name") or "unknown", "cores_used": len(cpus), "cpu_ids": cpus,
            "cores_online": os.cpu_count(), "avx2": "avx2" in _cpuinfo("flags").split(),
            "python": platform.python_version(), "kernel": platform.release()}


def dataset(root: str) -> dict:
    """The JPEGs under `root`: how many, their mean and total bytes; `root` made portable."""
    sizes = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.lower().endswith((".jpg", ".jpeg")):
                sizes.append(os.path.getsize(os.path.join(dirpath, name)))
    n = len(sizes)
    return {"root": portable(root), "files": n,
            "mean_bytes": sum(sizes) / n if n else 0, "total_bytes": sum(sizes)}


def versions(extra: dict | None = None) -> dict:
    """torch, the PIL build, DALI (None when absent), coordl, then `extra` (name -> version)."""
    import PIL
    import torch

    import coordl

    pil = "pillow-simd" if ".post" in PIL.__version__ else "Pillow"
    out = {"torch": torch.__version__, pil: PIL.__version__}
    try:
        import nvidia.dali as dali

        out["dali"] = dali.__version__
    except ImportError:
        out["dali"] = None
    out.update(extra or {})
    out["coordl"] = coordl.__version__
    return out
