"""A Ray Tune search of 3 trials at one coordl daemon (tests/integrations/test_ray_tune.py): a
stopper ends one of them mid-epoch (after batch 1 of its first epoch), the other two run 3 epochs.

    python ray_stop_job.py DATA OUT

writes OUT (JSON): each trial's config, status and reports, the daemon's status once the search is
done and the trials' processes are gone, and what was left of this process's children after
ray.shutdown().
"""

import hashlib
import json
import os
import sys
import time

import psutil
import ray
import torch
from ray import tune

from coordl.integrations.ray import shared_prep

EPOCHS = 3
TRIALS = [{"batch_size": 8, "doomed": False}, {"batch_size": 12, "doomed": False},
          {"batch_size": 12, "doomed": True}]


def train(config, prep):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    trial = config["trial"]
    loader = prep.loader(batch_size=trial["batch_size"])
    model = torch.nn.Linear(3 * 8 * 8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(EPOCHS):
        digests = []
        for k, (images, labels) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(
                model(torch.nn.functional.avg_pool2d(images.float() / 255, 4).flatten(1)), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            digests.append(hashlib.sha256(images.numpy().tobytes() + labels.numpy().tobytes()).hexdigest())
            if trial["doomed"]:  # tune.report raises SystemExit here once the stopper said stop
                tune.report({"doomed": True, "epoch": loader.epoch, "batch": k, "pid": os.getpid(),
                             "digests": [], "daemon_decodes": loader.stats()["daemon_decodes"]})
        tune.report({"doomed": trial["doomed"], "epoch": loader.epoch, "batch": k, "pid": os.getpid(),
                     "digests": digests, "daemon_decodes": loader.stats()["daemon_decodes"]})


def stop(trial_id, result) -> bool:
    return bool(result["doomed"]) and result["batch"] >= 1


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main() -> None:
    data, out = sys.argv[1], sys.argv[2]
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        # 3 chunks of 4 in the ring: the doomed trial, had it stayed attached holding one, would
        # stop the others within the epoch (until --straggler-timeout, 300 s)
        with shared_prep(data, batch_size=4, size=32, workers=1, min_jobs=3, slots=3, epochs=EPOCHS) as prep:
            trainable = tune.with_resources(tune.with_parameters(train, prep=prep), {"cpu": 0.5})
            tuner = tune.Tuner(trainable, param_space={"trial": tune.grid_search(TRIALS)},
                               run_config=tune.RunConfig(stop=stop, verbose=0))
            results = tuner.fit()
            pids = {int(r.metrics["pid"]) for r in results}
            deadline = time.monotonic() + 30  # the trials' processes end as Tune stops their actors
            while any(map(_running, pids)) and time.monotonic() < deadline:
                time.sleep(0.1)
            (status,) = prep.status().values()
            trials = [{"config": r.config["trial"], "error": None if r.error is None else repr(r.error),
                       "pid": int(r.metrics["pid"]), "pid_alive": _running(int(r.metrics["pid"])),
                       "reports": r.metrics_dataframe[["epoch", "batch", "digests", "daemon_decodes"]]
                       .to_dict("records")} for r in results]
    finally:
        ray.shutdown()
    gone, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=20)
    with open(out, "w") as f:
        json.dump({"trials": trials, "status": status,
                   "children_left": [" ".join(p.cmdline()[:3]) for p in alive]}, f)


if __name__ == "__main__":
    main()
