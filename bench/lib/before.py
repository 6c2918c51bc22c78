"""Build coordl as it was at an earlier commit, for the `coordl-before` row of bench/loaders.py.

    .venv/bin/python bench/lib/before.py 9fd5a12
    flock /tmp/coordl-bench.lock .venv/bin/python bench/loaders.py $BENCH_DATA/photo \\
        --loaders coordl,coordl-before --repeats 5 --out bench/results/loaders-before-after

The commit's tree (`git archive`) is installed without dependencies into
.venv/coordl-before (`pip install --target`, its C region decoder compiled as
the project's own install compiles it); the bench's child puts that folder
first on sys.path, so it imports the earlier coordl beside today's torch and
pillow-simd. The commit is written to .venv/coordl-before/COMMIT.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BEFORE = os.path.join(REPO, ".venv", "coordl-before")


def build(commit: str, target: str = BEFORE) -> str:
    """Install coordl at `commit` into `target`; returns the full commit id."""
    full = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="coordl-before-") as tmp:
        tree = os.path.join(tmp, "src")
        os.mkdir(tree)
        archive = subprocess.run(["git", "-C", REPO, "archive", full], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", target, tree], check=True, env={**os.environ, "CC": "cc -mavx2"})
    with open(os.path.join(target, "COMMIT"), "w") as f:
        f.write(full + "\n")
    return full


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("commit", help="a commit of this repository (e.g. 9fd5a12)")
    p.add_argument("--target", default=BEFORE)
    a = p.parse_args()
    full = build(a.commit, a.target)
    print(f"coordl at {full[:12]} installed in {a.target}")


if __name__ == "__main__":
    main()
