"""A training job over any coordl dataset by import path, for the sample-spec tests, run as its own
process.

    python sample_job.py '{"dataset": "coordl.datasets.audio:AudioFolder", "args": {"root": ...},
                           "seed": 3, "socket": ..., "batch_size": 4, "epochs": 2, "out": "result.json"}'

Prints "attached" once attached, then writes `out`: per epoch, per batch the sha256 of the samples'
bytes and the labels' (`digest`), the item ids, the batch's shape and dtype, and the daemon's status
at the end; or the error that stopped it.
"""

import hashlib
import json
import sys

import coordl
from coordl.datasets.base import from_import_path


def digest(samples, labels) -> str:
    """What a test compares batch for batch with a local loader's: exact bytes, in order."""
    h = hashlib.sha256()
    for t in (samples, labels):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    args = json.loads(sys.argv[1])
    result: dict = {"epochs": [], "error": None}
    code = 0
    try:
        ds = from_import_path(args["dataset"], args.get("args"), args.get("seed", 0), "raise")
        loader = coordl.DataLoader(ds, batch_size=args["batch_size"], shuffle=True,
                                   coordinator="unix://" + args["socket"])
        result["start_epoch"] = loader.coordinator.welcome.start_epoch
        print("attached", flush=True)
        for _ in range(args["epochs"]):
            batches = []
            for batch in loader:
                samples, labels = batch
                batches.append({"digest": digest(samples, labels), "ids": batch.indices.tolist(),
                                "shape": list(samples.shape), "dtype": str(samples.dtype)})
            result["epochs"].append({"epoch": loader.epoch, "batches": batches})
        result["status"] = loader.coordinator.status()
    except coordl.CoordlError as e:
        result["error"], result["error_type"] = str(e), type(e).__name__
        code = 3
    with open(args["out"], "w") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
