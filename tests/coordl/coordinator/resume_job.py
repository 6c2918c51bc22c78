"""A coordinated training job that checkpoints and resumes, run as its own process.

    python resume_job.py '{"root": ..., "socket": ..., "iterations": 2, "out": "result.json",
                           "state_in": null | "state.json", "save_at": null | [j, k],
                           "state_out": "state.json", "hold_at": null | [j, k], "hold": "fifo"}'

Builds `coordl.DataLoader(ImageFolder(root), batch_size=4, coordinator=...)`; with
"state_in" it loads that JSON state first. It runs "iterations" ``iter(loader)``s (one more
than the daemon allows is recorded as the refusal). Per batch it records the epoch, the
global batch index and the sha256 of the image, label and id bytes. With "save_at": [j, k]
it writes ``loader.state_dict()`` as JSON to "state_out" after the k-th batch (1-based)
of its j-th iteration, prints "saved" and blocks on stdin until killed (a preemption);
k = 0 saves before that iteration's first batch. With "hold_at": [j, k] it stops there
until the test writes a line into the fifo "hold". Prints "attached" and "batch J K".
"""

import hashlib
import json
import sys

import coordl


def digest(batch) -> str:
    images, labels = batch
    h = hashlib.sha256()
    for t in (images.contiguous(), labels, batch.indices):
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    args = json.loads(sys.argv[1])
    result: dict = {"batches": [], "error": None, "states": []}
    ds = coordl.ImageFolder(args["root"], transform="train", size=32, seed=0)
    loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, timeout=60,
                               coordinator="unix://" + args["socket"])
    try:
        if args.get("state_in"):
            with open(args["state_in"]) as f:
                loader.load_state_dict(json.load(f))
        result["state_at_start"] = loader.state_dict()
        print("attached", flush=True)
        for j in range(args["iterations"] + 1):
            if j == args["iterations"]:
                result["stats"] = loader.stats()  # before the iteration the daemon refuses
            if args.get("save_at") == [j, 0]:
                save(loader, args)
            for k, batch in enumerate(loader, 1):
                result["batches"].append([batch.epoch, batch.index, digest(batch)])
                print(f"batch {j} {k}", flush=True)
                if args.get("save_at") == [j, k]:
                    save(loader, args)
                if args.get("hold_at") == [j, k]:
                    with open(args["hold"]) as fifo:  # blocks until the test writes a line
                        fifo.readline()
            result["states"].append(loader.state_dict())
    except coordl.CoordlError as e:
        result["error"], result["error_type"] = str(e), type(e).__name__
    with open(args["out"], "w") as f:
        json.dump(result, f)
    return 0


def save(loader, args) -> None:
    with open(args["state_out"], "w") as f:
        json.dump(loader.state_dict(), f)
    print("saved", flush=True)
    sys.stdin.readline()  # the test kills this process here
    sys.exit(5)


if __name__ == "__main__":
    sys.exit(main())
