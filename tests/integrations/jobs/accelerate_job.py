"""accelerator.prepare(coordl.DataLoader): one process, or one per rank under torchrun.

    accelerate_job.py ROOT OUT_DIR EPOCHS [cache | coordinator=unix:///path.sock]

Each rank writes OUT_DIR/rank<r>.json: the item ids (labels of the one-image-per-class
dataset) of every epoch and coordl.loader_stats of the prepared loader after each epoch.
"""

import hashlib
import json
import os
import sys

from accelerate import Accelerator

import coordl


def main() -> None:
    root, out, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cached = "cache" in sys.argv[4:]
    coordinator = next((a.split("=", 1)[1] for a in sys.argv[4:] if a.startswith("coordinator=")), None)
    acc = Accelerator(cpu=True)
    ds = coordl.ImageFolder(root, transform="train", size=32, seed=3)
    if coordinator:   # the daemon prepares the batches: no worker processes of our own
        loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, coordinator=coordinator)
    else:
        kw = {"cache": ds.manifest.total_bytes // 2} if cached else {}
        loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                                   **kw)
    prepared = acc.prepare(loader)
    record = {"rank": acc.process_index, "world": acc.num_processes, "type": type(prepared).__name__,
              "is_coordl": isinstance(prepared, coordl.DataLoader), "epochs": [], "stats": [],
              "plan": [loader.epoch_indices(e) for e in range(epochs)] if not coordinator else []}
    if coordinator:
        record["attached_jobs"] = len(loader.coordinator.status()["jobs"])
    record["digests"], record["reference"] = [], []
    for _epoch in range(epochs):
        ids, digests = [], []
        for images, labels in prepared:
            assert images.shape[1:] == (3, 32, 32), images.shape
            ids.extend(labels.tolist())
            digests.append(hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest())
        record["epochs"].append(ids)
        record["digests"].append(digests)
        record["stats"].append(coordl.loader_stats(prepared))
    if acc.num_processes == 1:  # coordl's own loader over the same dataset, for the same batches
        alone = coordl.DataLoader(coordl.ImageFolder(root, transform="train", size=32, seed=3), batch_size=4,
                                  shuffle=True)
        record["reference"] = [[hashlib.sha256(x.contiguous().numpy().tobytes()).hexdigest() for x, _ in alone]
                               for _ in range(epochs)]
    if cached:
        record["cache_bytes"] = loader.dataset.cache.stats()["cache_bytes"]
        record["total_bytes"] = ds.manifest.total_bytes
        acc.wait_for_everyone()
        if acc.is_main_process:
            loader.dataset.cache.drop()
    with open(os.path.join(out, f"rank{acc.process_index}.json"), "w") as f:
        json.dump(record, f)
    acc.end_training()  # destroys the process group before the interpreter's teardown (see lightning_job.py)


if __name__ == "__main__":
    main()
