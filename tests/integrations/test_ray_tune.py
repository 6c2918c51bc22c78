"""Ray Tune (coordl.integrations.ray, `pip install -e '.[ray]'`): real searches on this machine
(`ray.init(num_cpus=2)`) whose trials share one `coordl serve` daemon: docs/ray-tune.md's example,
run as it is written there, and a search in which Tune stops a trial mid-epoch
(jobs/ray_stop_job.py). Each runs as its own process (tests/jobs.py: bounded, stacks on a hang,
no process of its session left), with Ray's temp folder, the daemons' folders (TMPDIR) and Tune's
results (HOME) in a short folder of the test's, checked free of coordl's leftovers."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile

import coordl_tests_jobs as jobs
import pytest

import coordl
from coordl.cache import shm

pytest.importorskip("ray.tune", reason="pip install -e '.[ray]'")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "ray-tune.md")
N = 40  # tiny_root's images


def _doc_example(test: str) -> str:
    """The python block of docs/ray-tune.md marked as tested by `test`."""
    text = open(DOC).read()
    mark = f"<!-- docs-test: tested-by tests/integrations/test_ray_tune.py::{test} -->\n```python\n"
    assert mark in text, f"docs/ray-tune.md has no block marked {mark!r}"
    return text.split(mark, 1)[1].split("\n```\n", 1)[0] + "\n"


def _local(root: str, batch_size: int, epoch: int) -> list[str]:
    """Digests of a local loader's batches of `epoch`, as the trials compute them."""
    loader = coordl.DataLoader(coordl.ImageFolder(root, transform="train", size=32, seed=0),
                               batch_size=batch_size, shuffle=True)
    loader.set_epoch(epoch)
    return [hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest() for x, y in loader]


@pytest.fixture
def ray_tmp():
    """(folder, env) for a Ray job: RAY_TMPDIR, TMPDIR and HOME there (short: Ray's sockets live in
    it). At the end nothing of coordl may be left in it (a daemon's folder `coordl-ray-*`), nor of
    Ray in /dev/shm; it is removed then."""
    folder = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    shm_before = set(os.listdir("/dev/shm"))
    yield folder, {"RAY_TMPDIR": folder, "TMPDIR": folder, "HOME": folder}
    left = [n for n in os.listdir(folder) if n.startswith("coordl")]
    # Ray's own (coordl's segments are in this session's COORDL_SHM_DIR, which no_leaks checks;
    # other people's coordl daemons on this machine use /dev/shm itself)
    shm_new = [n for n in set(os.listdir("/dev/shm")) - shm_before if re.match(r"(plasma|ray)", n)]
    shutil.rmtree(folder, ignore_errors=True)
    assert left == [], f"left in {folder}: {left}"
    assert shm_new == [], f"left in /dev/shm: {shm_new}"


def _run(args: list[str], env: dict) -> str:
    """A Python script of `args` run to its end as a job (coordl_tests_jobs.run); its stdout."""
    return jobs.run([sys.executable, *args], env, timeout=150)


def test_a_tune_search_shares_one_daemon(tiny_root, ray_tmp):
    folder, env = ray_tmp
    script = os.path.join(folder, "ray_tune_example.py")
    with open(script, "w") as f:
        f.write(_doc_example("test_a_tune_search_shares_one_daemon"))
    out = _run([script, tiny_root], env)
    trials = json.loads(out.strip().splitlines()[-1])
    assert sorted((t["batch_size"], t["lr"]) for t in trials) == [(8, 0.01), (8, 0.1), (12, 0.01), (12, 0.1)]
    for t in trials:
        assert [e["epoch"] for e in t["epochs"]] == [0, 1]        # all 4 began at the daemon's epoch 0
        for e in t["epochs"]:
            assert e["digests"] == _local(tiny_root, t["batch_size"], e["epoch"]), (t["batch_size"], e["epoch"])
        # the daemon decoded each image once per epoch for the 4 trials together (it serves
        # exactly epochs=2): 80, where 4 loaders of their own decode 320
        assert t["daemon_decodes"] == 2 * N
    assert "decodes: [80, 80, 80, 80]" in out


def test_a_trial_stopped_mid_epoch_detaches_and_the_others_finish(tiny_root, ray_tmp, tmp_path):
    folder, env = ray_tmp
    result = str(tmp_path / "result.json")
    _run([os.path.join(os.path.dirname(__file__), "jobs", "ray_stop_job.py"), tiny_root, result], env)
    with open(result) as f:
        rec = json.load(f)
    assert rec["children_left"] == []
    by = {(t["config"]["batch_size"], t["config"]["doomed"]): t for t in rec["trials"]}
    doomed = by[(12, True)]
    assert doomed["error"] is None                                   # stopped by Tune, not failed
    assert [(r["epoch"], r["batch"]) for r in doomed["reports"]] == [(0, 0), (0, 1)]
    for key in ((8, False), (12, False)):
        t = by[key]
        assert t["error"] is None
        assert [r["epoch"] for r in t["reports"]] == [0, 1, 2]
        for r in t["reports"]:
            assert r["digests"] == _local(tiny_root, key[0], r["epoch"])
        assert t["reports"][-1]["daemon_decodes"] == 3 * N          # nothing prepared twice for anyone
    assert not any(t["pid_alive"] for t in rec["trials"])
    status = rec["status"]
    assert status["jobs"] == []                                      # every trial detached
    assert status["owed"] == 1                                       # the doomed one left with epochs to go


def test_the_daemons_stop_on_an_interrupt_a_killed_actor_and_a_bad_start(tiny_root, ray_tmp, tmp_path):
    folder, env = ray_tmp
    result = str(tmp_path / "result.json")
    _run([os.path.join(os.path.dirname(__file__), "jobs", "ray_lifecycle_job.py"), tiny_root, result], env)
    with open(result) as f:
        rec = json.load(f)
    assert rec["children_left"] == []
    # KeyboardInterrupt inside the block: the daemon stopped the clean way, nothing of it left
    where = rec["interrupted"]
    assert where == {"daemon_gone": True, "socket": where["socket"], "ring": where["ring"], "socket_left": False,
                     "folder_left": False, "ring_left": False}
    assert where["socket"].startswith(os.path.join(folder, "coordl-ray-"))
    assert os.path.dirname(where["ring"]) == shm.SHM_DIR  # the trials' and daemons' COORDL_SHM_DIR: no_leaks
    assert rec["copy_address"] == "unix://" + rec["interrupted"]["socket"]  # a pickled copy finds it
    assert "driver's" in rec["copy_status"] and "have been stopped" in rec["closed_status"]
    # its actor killed: the daemon died with it; close() removed its ring, socket and folder
    assert rec["killed"] == {"daemon_gone": True, "socket_left": False, "ring_left": False, "folder_left": False}
    # a daemon that cannot start: coordl's error, in words, not Ray's wrapper
    assert rec["bad_start"].startswith("coordl serve for shared_prep on this node exited (1): ")
    assert "no-such-folder' does not exist" in rec["bad_start"]


def test_a_node_daemon_serves_and_stops_without_ray(tiny_root, tmp_path, monkeypatch):
    """The actor's object itself, in this process: its daemon serves a coordinated loader, and
    stop() leaves nothing, also after the daemon was killed (SIGKILL: its ring removed by name)."""
    from coordl.coordinator import segments
    from coordl.integrations.ray import NodeDaemon, serve_options

    tmp = tempfile.mkdtemp(prefix="rtn-", dir="/tmp")  # short: tmp_path may be too long for a socket
    monkeypatch.setenv("TMPDIR", tmp)                   # (then the folder is in /tmp: socket_folder)
    tempfile.tempdir = None  # TMPDIR read again
    try:
        node = NodeDaemon(serve_options(tiny_root, 4, size=32, workers=1, join_window=0))
        where = node.start()
        assert where["socket"] == os.path.join(node.folder, "serve.sock") and node.folder.startswith(tmp)
        assert node.status()["pid"] == where["pid"]
        loader = coordl.DataLoader(coordl.ImageFolder(tiny_root, size=32), batch_size=12, shuffle=True,
                                   coordinator="unix://" + where["socket"])
        digests = [hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest() for x, y in loader]
        assert digests == _local(tiny_root, 12, 0)
        loader.coordinator.close()
        assert node.stop() == 0
        assert not os.path.exists(node.folder)
        assert [n for n in os.listdir(segments.SHM_DIR) if n.startswith(segments.daemon_prefix(where["pid"]))] == []

        killed = NodeDaemon(serve_options(tiny_root, 4, size=32, workers=1))
        where = killed.start()
        prefix = segments.daemon_prefix(where["pid"])
        assert [n for n in os.listdir(segments.SHM_DIR) if n.startswith(prefix)]
        os.kill(where["pid"], signal.SIGKILL)
        assert killed.stop() == -signal.SIGKILL
        assert [n for n in os.listdir(segments.SHM_DIR) if n.startswith(prefix)] == []
        assert not os.path.exists(killed.folder)
        assert os.listdir(tmp) == []
    finally:
        tempfile.tempdir = None
        shutil.rmtree(tmp, ignore_errors=True)
