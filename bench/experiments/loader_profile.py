"""Run coordl's loader for a few epochs so a sampling profiler can watch its workers.

    py-spy record --native --subprocesses --format raw -o prof.txt -- \
        .venv/bin/python bench/experiments/loader_profile.py /work/bench-data/photo
    .venv/bin/python bench/experiments/collapse.py prof.txt   # workers only; --all for every process
"""

from __future__ import annotations

import sys

import coordl


def main() -> None:
    root = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    loader = coordl.DataLoader(coordl.ImageFolder(root, "train"), batch_size=64, shuffle=True,
                               num_workers=2, persistent_workers=True)
    for _ in range(epochs):
        for _images, _labels in loader:
            pass
    print(loader.stats())


if __name__ == "__main__":
    main()
