"""Every kept benchmark (and each experiment) still runs, on a handful of images.

Each benchmark runs as a user runs it (`.venv/bin/python bench/X.py ...`, its
own processes, a real `coordl serve` for the coordinator) with the flags of a
tiny run, and writes OUT.json + OUT.md through bench/lib/report.py; the checks
count exact things (images per epoch, samples, bytes read) so that a
benchmark that silently measures nothing fails here. The committed results
must not name a machine path, a host or a tracker, and the files the READMEs
cite must exist.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from coordl.cli.make_dataset import make_dataset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")
IMAGES, BATCH = 32, 8


def _module(name: str):
    """A helper of bench/lib/ (not a benchmark) as a module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, "lib", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _module("report")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("bench-data") / "smoke")
    make_dataset(path, images=IMAGES, classes=4, size=(96, 72), quality=85, seed=7, workers=1, progress=False)
    return path


def _run(script: str, *args: str, out: str | None = None, timeout: float = 240) -> dict | None:
    argv = [sys.executable, os.path.join(BENCH, script), *args] + (["--out", out] if out else [])
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    if out is None:
        return None
    with open(out + ".json") as f:
        text = f.read()
    with open(out + ".md") as f:
        md = f.read()
    assert report.leaks(text + md) == [], "a result names this machine"
    assert "warning" not in proc.stderr
    return {"json": json.loads(text), "md": md, "stdout": proc.stdout}


def test_loaders(root, tmp_path):
    names = ["coordl", "torch-pillow", "torch-simd", "floor", "floor-parallel"]
    r = _run("loaders.py", root, "--repeats", "1", "--settle", "0", "--batch-size", str(BATCH),
             "--loaders", ",".join(names), out=str(tmp_path / "loaders"))
    res = r["json"]
    assert list(res["loaders"]) == names
    for name, lo in res["loaders"].items():
        assert lo["images_per_epoch"] == IMAGES, name
        assert len(lo["per_round"]) == 1 and lo["median"] > 0, name
        assert len(lo["rss_per_epoch"]) == 2, name  # warm-up + one round
    assert sorted(res["ratios"]) == sorted(f"coordl/{n}" for n in names[1:])
    assert res["dataset"] == {**res["dataset"], "root": "$BENCH_DATA/smoke", "files": IMAGES}
    assert res["versions"]["plain Pillow (torch-pillow)"] == res["loaders"]["torch-pillow"]["pil"]
    assert res["command"].startswith(".venv/bin/python bench/loaders.py $BENCH_DATA/smoke --repeats 1")
    assert sum(line.startswith(("| coordl |", "| torch-pillow |", "| floor (x cores) |"))
               for line in r["md"].splitlines()) == 3


def test_loaders_before_and_after(root, tmp_path):
    # bench/lib/before.py installs an earlier commit (here HEAD) beside the repository's coordl
    target = str(tmp_path / "before")
    _run("lib/before.py", "HEAD", "--target", target)
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    r = _run("loaders.py", root, "--repeats", "1", "--settle", "0", "--batch-size", str(BATCH),
             "--loaders", "coordl,coordl-before", "--before-dir", target, out=str(tmp_path / "ba"))
    res = r["json"]
    assert res["before_commit"] == head and f"commit {head}" in r["md"]
    assert res["loaders"]["coordl-before"]["coordl_from"] == "coordl-path"
    assert res["loaders"]["coordl"]["coordl_from"] == "repository"
    assert all(lo["images_per_epoch"] == IMAGES for lo in res["loaders"].values())
    assert "coordl/coordl-before" in res["ratios"]


def test_minio_vs_pagecache(root, tmp_path):
    cgroup = _module("cgroup")
    why = cgroup.why_not("memory", "memory.limit_in_bytes")
    if why:
        pytest.skip(f"bench/minio_vs_pagecache.py needs a cgroup v1 memory controller: {why}")
    r = _run("minio_vs_pagecache.py", "--data", root, "--fractions", "0.5", "--epochs", "2",
             "--throttle-mbps", "0", "--workers", "1", "--batch-size", str(BATCH), out=str(tmp_path / "minio"))
    res = r["json"]
    total = res["dataset"]["bytes"]
    runs = {run["side"]: run["epochs"] for run in res["runs"]}
    assert sorted(runs) == ["minio", "pagecache"] and all(len(e) == 2 for e in runs.values())
    first, second = runs["minio"]
    assert first["storage_bytes"] == total and first["cache_hits"] == 0  # the first epoch fills the cache
    assert 0 < second["cache_hits"] < IMAGES  # then half the bytes come from memory, the rest from storage
    assert 0 < second["storage_bytes"] < total
    assert all(e["cache_hits"] == 0 and e["storage_bytes"] == total for e in runs["pagecache"])
    assert "| 0.50 |" in r["md"]
    # a set this small lets the page cache hold all of it: the bench says so, with the size it needs
    assert "too small for this comparison" in r["stdout"] and "too small" in r["md"]
    assert res["settings"]["dataset_bytes_needed"] == 2 * 32 * 2**20 / (1 - 0.5)


def test_minio_vs_pagecache_says_the_dataset_size_it_needs():
    help_text = subprocess.run([sys.executable, os.path.join(BENCH, "minio_vs_pagecache.py"), "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "256 MiB with the defaults" in " ".join(help_text.split())
    spec = importlib.util.spec_from_file_location("bench_minio", os.path.join(BENCH, "minio_vs_pagecache.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, BENCH)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(BENCH)
    mib = 2**20
    assert mod.size_needed([0.25, 0.5, 0.75], 32 * mib) == 256 * mib
    assert mod.size_warning(300 * mib, [0.25, 0.5, 0.75], 32 * mib) is None  # the committed run's 299 MiB
    assert "at least 256 MiB" in mod.size_warning(60 * mib, [0.25, 0.5, 0.75], 32 * mib)


def test_scale_leaves_the_page_cache_alone_unless_asked(tmp_path):
    """bench/scale.py drops the whole machine's page cache only with --drop-page-cache: without it
    (even as root) no figure is cold, and --help says what the flag does."""
    help_text = subprocess.run([sys.executable, os.path.join(BENCH, "scale.py"), "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "--drop-page-cache" in help_text and "WHOLE MACHINE" in " ".join(help_text.split())
    out = subprocess.run([sys.executable, os.path.join(BENCH, "scale.py"), "--files", "40", "--classes", "4",
                          "--rounds", "1", "--rows", "stat,first", "--root", str(tmp_path / "tree")],
                         capture_output=True, text=True, timeout=240, check=True).stdout
    rows = json.loads(out[out.index('{\n "rows"'):])["rows"]
    assert sorted(rows) == ["first", "stat"]
    assert all(r["cold_runs_s"] == [None] and r["cold_s"] is None and r["warm_s"] > 0 for r in rows.values())


@pytest.mark.parametrize("args", [["--epochs", "2", "--throttle-mbps", "0", "--batch-size", "8", "--workers", "0"],
                                  ["--local-reads", "--local-repeats", "1"]])
def test_partitioned_leaves_nothing_in_tmp(tmp_path, args):
    """bench/partitioned.py removes the folders it made for its redis-servers (in $TMPDIR)."""
    data = str(tmp_path / "data")  # 500x375 JPEGs: half the set is over a node's 1 MiB minimum budget
    make_dataset(data, images=32, classes=4, seed=7, workers=1, progress=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "partitioned.py"), "--data", data, *args,
                           "--out", str(tmp_path / "part")], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "part.json") as f:
        res = json.load(f)
    assert "local_reads" in res if "--local-reads" in args else sorted(res["sides"]) == ["minio", "none",
                                                                                             "partitioned"]
    assert os.listdir(tmp) == []


def test_coordinator(root, tmp_path):
    r = _run("coordinator.py", "--data", root, "--ks", "1", "--computes", "0", "--epochs", "1", "--warmup", "1",
             "--rounds", "1", "--samples", "2", "--transport-rounds", "1", "--batch-size", str(BATCH),
             "--workers", "1", "--slots", "2", "--delivery-modes", "coord-pin,coordl", "--transport-modes", "coord",
             out=str(tmp_path / "coordinator"))
    res = r["json"]
    assert sorted(run["mode"] for run in res["runs"]) == ["coord", "coordl", "torch"]
    runs = {run["mode"]: run for run in res["runs"]}
    assert runs["torch"]["images"] == runs["coordl"]["images"] == IMAGES  # one job, one measured epoch
    # the daemon filled its 2 slots with the measured epoch's first batches while the job waited at
    # the barrier: received untimed, so only batches prepared inside the window are timed
    assert runs["coord"]["untimed_batches"] == [2]
    assert runs["coord"]["images"] == IMAGES - 2 * BATCH
    assert set(res["summary"]["0.0/1"]) >= {"coord", "torch", "coordl", "coord/torch", "coord/coordl"}
    assert sorted(res["delivery"]) == ["coord-pin", "coordl"]  # (each mode is one more job and daemon start)
    assert all(d["samples"] == 2 and d["shape"] == [BATCH, 3, 224, 224] for d in res["delivery"].values())
    # the whole epoch in the ring: every full batch but the first is timed
    assert list(res["transport"]) == ["coord"] and res["transport"]["coord"]["samples"] == IMAGES // BATCH - 1
    assert "| 0 ms | 1 |" in r["md"]


@pytest.mark.parametrize("script,args", [
    ("experiments/roi.py", ["--files", "8", "--repeats", "1"]),
    ("experiments/steps.py", ["--files", "16", "--rounds", "1"]),
    ("experiments/profile_pipeline.py", ["--files", "8"]),
])
def test_experiment_runs(root, tmp_path, script, args):
    r = _run(script, root, *args, out=str(tmp_path / "exp"))
    assert r["json"]["command"].startswith(f".venv/bin/python bench/{script} $BENCH_DATA/smoke")
    assert r["md"].count("\n|") >= 4  # a table with rows


def test_loader_profile_and_collapse(root, tmp_path):
    _run("experiments/loader_profile.py", root, "1")
    raw = tmp_path / "prof.txt"
    raw.write_text("_worker_loop (torch);prep_into (coordl);ImagingJpegDecode 30\n"
                   "_worker_loop (torch);resize (PIL/Image.py) 10\n"
                   "main (x);_next_data (torch) 5\n")
    out = subprocess.run([sys.executable, os.path.join(BENCH, "experiments", "collapse.py"), str(raw)],
                         capture_output=True, text=True, check=True).stdout
    assert "| (total) | 40 | 100% |" in out  # worker stacks only
    assert re.search(r"\| JPEG decode [^|]*\| 30 \| 75\.0% \|", out)


def test_report_write_and_portable(tmp_path, monkeypatch):
    out = str(tmp_path / "sub" / "r")
    report.write(out, {"root": report.portable("/somewhere/data/photo")}, "| a |\n", echo=False)
    assert json.loads(open(out + ".json").read()) == {"root": "$BENCH_DATA/photo"}
    assert open(out + ".md").read() == "| a |\n"
    assert report.portable(os.path.join(REPO, "bench", "results", "x")) == "bench/results/x"
    monkeypatch.setattr(sys, "argv", [os.path.join(BENCH, "loaders.py"), "/x/y/photo", "--out", "a b"])
    assert report.command().endswith("bench/loaders.py $BENCH_DATA/photo --out 'a b'")
    monkeypatch.setattr(sys, "argv", ["bench/loaders.py", "/x/photo", "--out", "/x/run", "--cpus", "0,1"])
    assert report.command() == ".venv/bin/python bench/loaders.py $BENCH_DATA/photo --out $OUT_DIR/run --cpus 0,1"
    assert report.leaks("Dataset: /work/bench-data/photo, `flock /tmp/lock`") == ["/work/", "/tmp/"]
    assert report.leaks("$BENCH_DATA/photo bench/results/x /dev/shm/coordl-cache") == []


TRACKER = re.compile(r"\b(issue|task|ticket)s?\b\s*#?\d", re.IGNORECASE)


def _result_files() -> list[str]:
    folder = os.path.join(BENCH, "results")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith((".md", ".json")))


def test_committed_results_name_no_machine_and_no_tracker():
    for path in _result_files():
        with open(path) as f:
            text = f.read()
        name = os.path.relpath(path, REPO)
        assert report.leaks(text) == [], f"{name} names a machine path or host: {report.leaks(text)}"
        assert not TRACKER.search(text), f"{name} refers to a tracker: {TRACKER.search(text).group(0)!r}"


READMES = ("README.md", "docs/results.md", "bench/README.md", "bench/results/README.md", "bench/experiments/README.md")


def test_cited_bench_files_exist():
    """The READMEs cite results and scripts by path: each must exist (bench/levers.py is cited as removed)."""
    cited = set()
    for readme in READMES:
        with open(os.path.join(REPO, readme)) as f:
            text = f.read()
        cited |= set(re.findall(r"(?<![\w/])bench/[\w/.-]+\.(?:py|md|json)", text))
        if readme.startswith("bench/"):  # these name results by file name alone
            cited |= {f"bench/results/{n}" for n in re.findall(r"`([\w-]+\.md)`", text) if n != "README.md"}
    cited.discard("bench/levers.py")
    missing = sorted(p for p in cited if not os.path.exists(os.path.join(REPO, p)))
    assert not missing, f"cited but missing: {missing}"


def _expand_braces(text: str) -> str:
    """`a-{b,c}-d` -> `a-b-d a-c-d`, as a shell expands it (the READMEs cite pairs of runs so)."""
    while m := re.search(r"([\w/.-]*)\{([\w,-]+)\}([\w/.*-]*)", text):
        text = text[:m.start()] + " ".join(m[1] + alt + m[3] for alt in m[2].split(",")) + text[m.end():]
    return text


def test_bench_results_hold_only_cited_runs():
    """bench/results/ holds the runs the READMEs cite and nothing else: each file's run (its name
    without .md/.json/.png) is named in a README, by a glob there, or by a results page a README
    cites (roi.md names the runs it sums up)."""
    import fnmatch

    folder = os.path.join(BENCH, "results")
    texts = []
    for readme in READMES:
        with open(os.path.join(REPO, readme)) as f:
            texts.append(_expand_braces(f.read()))
    text = "\n".join(texts)
    globs = set(re.findall(r"bench/results/([\w-]*\*[\w*-]*)", text))

    def named(stem: str, where: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(stem)}(?![\w-])", where) is not None

    runs = sorted({os.path.splitext(n)[0] for n in os.listdir(folder) if n != "README.md"})
    cited = {r for r in runs if named(r, text) or any(fnmatch.fnmatch(r, g) for g in globs)}
    for page in sorted(cited):  # a cited page cites the runs it sums up
        md = os.path.join(folder, page + ".md")
        if os.path.exists(md):
            with open(md) as f:
                page_text = f.read()
            cited |= {r for r in runs if r != page and named(r, page_text)}
    assert sorted(set(runs) - cited) == [], "bench/results/ holds runs no README cites (git rm them)"


def test_bench_readme_lists_every_benchmark_and_helper():
    """bench/README.md has one table row per script of bench/ and describes each helper of bench/lib/."""
    with open(os.path.join(BENCH, "README.md")) as f:
        text = f.read()
    rows = re.findall(r"^\| `([\w.]+\.py)` \|", text, flags=re.M)
    scripts = sorted(n for n in os.listdir(BENCH) if n.endswith(".py"))
    assert sorted(rows) == scripts, "one table row per benchmark or acceptance check"
    for n in sorted(os.listdir(os.path.join(BENCH, "lib"))):
        if n.endswith(".py") and n != "__init__.py":
            assert f"`{n}`" in text, f"bench/lib/{n} is not described in bench/README.md"
