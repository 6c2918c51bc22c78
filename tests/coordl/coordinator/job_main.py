"""A training job for the coordinator tests, run as its own process.

    python job_main.py '{"root": ..., "socket": ..., "batch_size": 4, "size": 32,
                         "epochs": 2, "sleep": 0.0, "out": "result.json",
                         "seed": 0, "on_error": "raise", "hold_at": "1 3", "hold": "/path/fifo",
                         "drop_last": false}'

Prints "attached" once attached and "batch <epoch> <k>" after each batch
(flushed, so a test can act at a known point), then writes `out`: per epoch
the sample ids, a checksum and a sha256 of each batch's pixels and labels, the daemon's status and
`loader.stats()` at the end, or the error that stopped it and when. With
"hold_at": "E K" it stops after batch K of epoch E until the test writes a
line into the fifo "hold" (an event, not a sleep).
"""

import hashlib
import json
import sys
import time

import torch

import coordl


def digest(images, labels) -> str:
    """sha256 of a batch's image and label bytes (the same for a local loader's batch)."""
    h = hashlib.sha256()
    for t in (images.contiguous(), labels):
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    # one thread per op: forked from a test process whose torch may have started its OpenMP pool,
    # a parallel op here (images.sum() of a batch of 16) would wait for ever on that pool's threads
    torch.set_num_threads(1)
    args = json.loads(sys.argv[1])
    result: dict = {"epochs": [], "error": None}
    code = 0
    try:
        ds = coordl.ImageFolder(args["root"], transform="train", size=args["size"],
                                seed=args.get("seed", 0), on_error=args.get("on_error", "raise"))
        loader = coordl.DataLoader(ds, batch_size=args["batch_size"], shuffle=True,
                                   drop_last=args.get("drop_last", False), coordinator="unix://" + args["socket"])
        result["start_epoch"] = loader.coordinator.welcome.start_epoch
        result["batches_per_epoch"] = len(loader)
        print("attached", flush=True)
        for _ in range(args["epochs"]):
            ids, sums, digests = [], [], []
            for k, batch in enumerate(loader):
                images, labels = batch
                ids += batch.indices.tolist()
                sums.append(int(images.sum()) + 7 * int(labels.sum()))
                digests.append(digest(images, labels))
                print(f"batch {loader.epoch} {k}", flush=True)
                if args.get("hold_at") == f"{loader.epoch} {k}":
                    with open(args["hold"]) as fifo:  # blocks until the test opens it and writes
                        fifo.readline()
                time.sleep(args.get("sleep", 0.0))
            result["epochs"].append({"epoch": loader.epoch, "ids": ids, "sums": sums, "digests": digests})
        result["status"] = loader.coordinator.status()
        result["stats"] = loader.stats()
    except coordl.CoordlError as e:
        result["error"], result["error_type"] = str(e), type(e).__name__
        result["error_at"] = time.time()
        code = 3
    with open(args["out"], "w") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
