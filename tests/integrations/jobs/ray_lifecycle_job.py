"""How shared_prep's daemons end (tests/integrations/test_ray_tune.py), no Tune search:

    python ray_lifecycle_job.py DATA OUT

1. KeyboardInterrupt inside the `with` block: the daemon is stopped (SIGTERM) and its folder removed;
2. its actor killed (ray.kill): the daemon dies with it (Ray kills a dead worker's children), and
   close() removes what it left (its ring, socket and folder) by a task on the node;
3. a daemon that cannot start (no such folder): CoordinatorError naming it, its actor gone.
Writes OUT (JSON): what was seen, and what was left of this process's children after ray.shutdown().
"""

import json
import os
import pickle
import sys
import time

import psutil
import ray

from coordl.errors import CoordinatorError
from coordl.integrations.ray import shared_prep


def _gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _daemon(prep) -> dict:
    (socket,) = prep.addresses.values()
    (status,) = prep.status().values()
    return {"socket": socket, "pid": status["pid"], "ring": status["ring"]}


def main() -> None:
    data, out = sys.argv[1], sys.argv[2]
    rec: dict = {}
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        # 1. interrupted
        try:
            with shared_prep(data, batch_size=4, size=32, workers=1) as prep:
                first = _daemon(prep)
                copy = pickle.loads(pickle.dumps(prep))  # as a trial gets it
                try:
                    copy.status()
                except CoordinatorError as e:
                    rec["copy_status"] = str(e)
                rec["copy_address"] = copy.address()
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            rec["interrupted"] = {"daemon_gone": _gone(first["pid"], 5.0), "socket": first["socket"],
                                  "ring": first["ring"],
                                  "socket_left": os.path.exists(first["socket"]),
                                  "folder_left": os.path.exists(os.path.dirname(first["socket"])),
                                  "ring_left": os.path.exists(first["ring"])}
        try:
            prep.status()
        except CoordinatorError as e:
            rec["closed_status"] = str(e)
        # 2. its actor killed
        prep = shared_prep(data, batch_size=4, size=32, workers=1)
        second = _daemon(prep)
        ray.kill(prep._daemons[0].actor)
        rec["killed"] = {"daemon_gone": _gone(second["pid"])}
        prep.close()  # its actor is dead: a task on the node removes what the daemon left
        rec["killed"].update(socket_left=os.path.exists(second["socket"]), ring_left=os.path.exists(second["ring"]),
                             folder_left=os.path.exists(os.path.dirname(second["socket"])))
        # 3. cannot start
        try:
            shared_prep(os.path.join(data, "no-such-folder"), batch_size=4, size=32, workers=1)
        except CoordinatorError as e:
            rec["bad_start"] = str(e)
    finally:
        ray.shutdown()
    _gone_, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=20)
    rec["children_left"] = [" ".join(p.cmdline()[:3]) for p in alive]
    with open(out, "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main()
