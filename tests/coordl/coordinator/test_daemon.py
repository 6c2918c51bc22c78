"""The coordinator with real daemon processes and real job processes: sharing and faults."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest

from coordl.coordinator import segments

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")
N = 40  # items in tiny_root


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _whole_epochs(result: dict, epochs: int) -> list[list[int]]:
    assert result["error"] is None, result["error"]
    assert [e["epoch"] for e in result["epochs"]] == list(range(result["start_epoch"],
                                                                result["start_epoch"] + epochs))
    orders = [e["ids"] for e in result["epochs"]]
    for ids in orders:
        assert sorted(ids) == list(range(N))  # every item exactly once
    return orders


def test_three_jobs_share_every_batch_and_decode_once(tiny_root, serve, jobs):
    served = serve(tiny_root, epochs=2, min_jobs=3)
    running = [jobs(tiny_root, served) for _ in range(3)]
    results = [j.result() for j in running]
    orders = [_whole_epochs(r, 2) for r in results]
    assert orders[0] == orders[1] == orders[2]           # same order in every job
    assert orders[0][0] != orders[0][1]                    # a new permutation each epoch
    assert results[0]["epochs"] == results[1]["epochs"] == results[2]["epochs"]  # same pixels
    decodes = [r["status"]["decodes"] for r in results]
    assert max(decodes) == 2 * N                           # N per epoch in all, not 3N
    assert served.wait() == 0                              # --epochs 2: it exits by itself
    assert served.segments_left() == []
    assert alive(served.workers) == []


def test_jobs_launched_together_start_together_and_share_every_batch(tiny_root, serve, jobs):
    # no --min-jobs: the default join window holds the first batch while the jobs arrive
    served = serve(tiny_root, epochs=2, join_window=None)
    running = [jobs(tiny_root, served) for _ in range(4)]  # launched back to back
    results = [j.result() for j in running]
    for r in results:
        assert r["returncode"] == 0 and r["error"] is None, r["error"]
        assert r["start_epoch"] == 0
        _whole_epochs(r, 2)
    assert all(r["epochs"] == results[0]["epochs"] for r in results)  # same ids, same pixels
    assert max(r["status"]["decodes"] for r in results) == 2 * N  # each batch prepared once
    assert served.wait() == 0  # every job had its 2 epochs and left
    assert served.segments_left() == []


def test_a_job_attaching_in_epoch_1_gets_all_its_epochs_then_the_daemon_stops(
        tiny_root, serve, jobs, tmp_path):
    served = serve(tiny_root, epochs=2, slots=3)
    hold = str(tmp_path / "hold")
    os.mkfifo(hold)
    first = jobs(tiny_root, served, hold_at="1 3", hold=hold)
    first.wait_for("batch 1 3")  # the first job is inside epoch 1 and waits there
    late = jobs(tiny_root, served)
    late.wait_for("attached")
    with open(hold, "w") as fifo:
        fifo.write("go\n")
    a, b = first.result(), late.result()
    assert a["start_epoch"] == 0 and len(_whole_epochs(a, 2)) == 2
    assert b["start_epoch"] == 2 and len(_whole_epochs(b, 2)) == 2  # epochs 2 and 3, both whole
    assert b["status"]["decodes"] == 4 * N  # epochs 0-3, each prepared once
    assert served.wait() == 0  # then it stops serving
    assert served.segments_left() == [] and alive(served.workers) == []


def test_sigkill_of_one_job_leaves_the_others_running(tiny_root, serve, jobs):
    # --linger 0: the killed job left with epochs to go, and is not waited for
    served = serve(tiny_root, epochs=2, min_jobs=3, slots=3, linger=0)
    running = [jobs(tiny_root, served, sleep=0.05) for _ in range(3)]
    running[1].wait_for("batch 0 3")
    running[1].proc.kill()
    survivors = [running[0].result(), running[2].result()]
    assert _whole_epochs(survivors[0], 2) == _whole_epochs(survivors[1], 2)
    assert running[1].proc.wait() == -signal.SIGKILL
    assert "detached: its socket closed" in served.log_text()
    assert served.wait() == 0
    assert "no job resumed within --linger 0 s after 1 left with epochs to go" in served.log_text()
    assert served.segments_left() == []
    assert not os.path.exists(served.socket)
    assert alive(served.workers) == []


def test_sigkill_of_the_daemon_makes_jobs_raise_promptly(tiny_root, serve, jobs):
    served = serve(tiny_root, slots=3, min_jobs=2)  # both jobs start at epoch 0, whatever the timing
    running = [jobs(tiny_root, served, epochs=1000, sleep=0.02) for _ in range(2)]
    for job in running:
        job.wait_for("batch 0 2")
    served.proc.kill()
    served.proc.wait()
    for job in running:  # epochs=1000: without the daemon's death they would go on for minutes
        result = job.result(timeout=20)
        assert result["returncode"] == 3
        assert result["error_type"] == "CoordinatorError"
        # an event, not a clock: the job learnt it from the socket the kernel closed (EOF) or
        # from the daemon's pid check, never by waiting out a timeout
        assert re.search(r"went away: (it closed the connection|its process is gone|the "
                         r"connection broke while sending)", result["error"]), result["error"]
        assert "within" not in result["error"]
    deadline = time.monotonic() + 5
    while alive(served.workers) and time.monotonic() < deadline:  # PR_SET_PDEATHSIG
        time.sleep(0.05)
    assert alive(served.workers) == []
    assert served.segments_left()  # a SIGKILLed daemon cannot clean up ...
    out = subprocess.run([COORDL, "cleanup"], capture_output=True, text=True, check=True).stdout
    assert served.segments_left() == []  # ... `coordl cleanup` does
    assert os.path.basename(served.ring) in out
    assert not os.path.exists(served.socket)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_shuts_down_cleanly_and_tells_the_jobs(tiny_root, serve, jobs, sig):
    served = serve(tiny_root, slots=3)
    job = jobs(tiny_root, served, epochs=1000, sleep=0.02)
    job.wait_for("batch 0 1")
    assert served.stop(sig) == 0
    result = job.result(timeout=20)
    assert result["error_type"] == "CoordinatorError"
    assert "shutting down" in result["error"] and signal.Signals(sig).name in result["error"]
    assert served.segments_left() == []
    assert not os.path.exists(served.socket)
    assert alive(served.workers) == []


def test_signals_during_the_shutdown_never_leave_the_ring_behind(tiny_root, serve, jobs):
    # a supervisor (or a test's teardown) may SIGTERM a daemon that is already stopping, by
    # itself after --epochs or after a first signal: it must still unlink its ring and socket
    # (seen in CI: the default handler came back before the ring was unlinked, and killed it)
    served = serve(tiny_root, slots=3, workers=2)
    job = jobs(tiny_root, served, epochs=1000, sleep=0.02)
    job.wait_for("batch 0 1")
    sent = 0
    while served.proc.poll() is None:  # SIGTERM after SIGTERM until it exits: many land in
        try:                           # the shutdown (reaping workers takes milliseconds)
            os.kill(served.pid, signal.SIGTERM)
            sent += 1
        except ProcessLookupError:
            break
        time.sleep(0.0005)
    served.wait()
    assert sent > 1
    assert served.segments_left() == [], served.log_text()
    assert not os.path.exists(served.socket)
    assert alive(served.workers) == []
    assert "shutting down" in job.result(timeout=20)["error"]


def test_sigterm_to_the_whole_process_group_is_a_shutdown_not_a_worker_death(tiny_root, serve, jobs):
    # systemd, `kill -- -PGID` and a detached daemon's session get SIGTERM to every process of
    # the group, prep workers included: the daemon decides, no worker is reported dead or replaced
    served = serve(tiny_root, slots=3, new_session=True)
    job = jobs(tiny_root, served, epochs=1000, sleep=0.02)
    job.wait_for("batch 0 1")
    for pid in served.workers:  # the order a group signal may reach them in: workers first
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)  # the kernel delivers at once; this is only the daemon's chance to misread EOF
    os.killpg(served.pid, signal.SIGTERM)
    assert served.proc.wait(30) == 0
    log = served.log_text()
    assert "shutting down: received SIGTERM" in log
    assert "died" not in log and "starting a new one" not in log, log
    assert "shutting down" in job.result(timeout=20)["error"]
    assert served.segments_left() == [] and alive(served.workers) == []


def test_socket_segment_and_folder_are_private(shared_serve):
    # (the shared daemon's clean stop, exit 0 and nothing left, is checked at the module's end)
    served = shared_serve
    assert stat.S_IMODE(os.stat(served.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(served.ring).st_mode) == 0o600
    assert os.path.basename(served.ring).startswith(served.prefix)


def test_a_second_daemon_on_the_same_socket_is_refused(tiny_root, shared_serve):
    served = shared_serve
    second = subprocess.run([COORDL, "serve", "--data", tiny_root, "--batch-size", "4",
                             "--socket", served.socket], capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert "already listens" in second.stderr
    assert served.status()["pid"] == served.pid


def test_status_command_shows_jobs_ring_and_rate(tiny_root, serve, jobs):
    served = serve(tiny_root, slots=3)
    job = jobs(tiny_root, served, epochs=1000, sleep=0.05)
    job.wait_for("batch 0 2")
    out = subprocess.run([COORDL, "status", "--socket", served.socket], capture_output=True,
                         text=True, check=True).stdout
    assert f"coordinator pid {served.pid}" in out
    assert "ring       3 slots" in out and "images/s" in out and "backend cpu," in out
    # the job goes on while `coordl status` starts (its epochs take 0.5 s): any epoch of its own
    assert re.search(r"job 1 +pid \d+ +(epoch \d+ \(its epochs 0 on\), \d+ of 10 batches handed out|"
                     r"between epochs \(its epochs 0 on\)), holds", out), out
    assert "clients    1 job attached, 0 other connections (limit" in out  # not itself
    assert served.status()["connections"] == 1  # the job; this request's connection not counted
    job.proc.kill()


def test_status_numbers_epochs_as_the_job_does(tiny_root, serve, jobs, tmp_path):
    # the job holds inside its second epoch: the daemon's epoch 1, loader.epoch == 1 in the job
    served = serve(tiny_root, epochs=2, slots=3)
    hold = str(tmp_path / "hold")
    os.mkfifo(hold)
    job = jobs(tiny_root, served, hold_at="1 3", hold=hold)
    job.wait_for("batch 1 3")
    out = subprocess.run([COORDL, "status", "--socket", served.socket], capture_output=True,
                         text=True, check=True).stdout
    assert re.search(r"job 1 +pid \d+ +epoch 1 \(its epochs 0-1\), (4|5) of 10 batches handed out, ",
                     out), out
    assert "daemon epoch" not in out and "its epoch 2" not in out  # one numbering, from 0
    with open(hold, "w") as fifo:
        fifo.write("go\n")
    assert job.result()["error"] is None
    assert served.wait() == 0


def test_detach_runs_in_the_background(tiny_root, sockdir):
    sock = os.path.join(sockdir, "bg.sock")
    out = subprocess.run([COORDL, "serve", "--data", tiny_root, "--batch-size", "4", "--size", "32",
                          "--socket", sock, "--workers", "1", "--detach"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "listening on unix://" + sock in out.stdout
    st = subprocess.run([COORDL, "status", "--socket", sock, "--json"], capture_output=True, text=True,
                        check=True).stdout
    status = json.loads(st)
    os.kill(status["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 20
    while alive([status["pid"], *status["workers"]]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive([status["pid"], *status["workers"]]) == []
    assert not [n for n in os.listdir(segments.SHM_DIR) if n.startswith(f"coordl-serve-{status['pid']}-")]
    assert "shutting down: received SIGTERM" in open(sock + ".log").read()


def test_cache_serves_every_epoch_after_the_first(tiny_root, serve, jobs):
    from coordl.cache.minio import admin

    # one prep worker: with two, epoch 1's first chunk may read an item that epoch 0's last chunk,
    # on the other worker, has not cached yet, and the exact counts below would be off by it
    served = serve(tiny_root, epochs=2, cache="64MiB", workers=1)
    try:
        result = jobs(tiny_root, served).result()
        _whole_epochs(result, 2)
        counters = result["status"]["counters"]
        assert counters["storage_reads"] == N and counters["cache_inserts"] == N  # epoch 0
        assert counters["cache_hits"] == N and counters["decodes"] == 2 * N     # epoch 1: no storage
        assert result["status"]["cache"]["cache_items"] == N
        stats = result["stats"]  # loader.stats() of the coordinated job
        assert stats["daemon_cache_hits"] == N and stats["daemon_cache_items"] == N
        assert stats["daemon_storage_reads"] == N and stats["batches"] == 20
        assert served.wait() == 0 and served.segments_left() == []
    finally:
        fingerprint = served.status_at_start["fingerprint"]
        admin.drop(segments.SHM_DIR, fingerprint[:16])


def test_a_killed_prep_worker_is_replaced(tiny_root, serve):
    import coordl

    served = serve(tiny_root, slots=3)
    loader = coordl.DataLoader(coordl.ImageFolder(tiny_root, transform="train", size=32), batch_size=4,
                               shuffle=True, coordinator=served.address, timeout=60)
    it = iter(loader)
    next(it)
    os.kill(served.workers[0], signal.SIGKILL)
    failed, got = 0, 1
    for _ in range(3):  # the epoch goes on: its chunks are prepared again by the others
        while True:
            try:
                next(it)
                got += 1
            except StopIteration:
                break
            except coordl.CoordinatorError as e:  # a death on a second worker fails the batch so
                assert "prep worker" in str(e) and "died" in str(e)  # (an internal error, not a sample's)
                failed += 1
        it = iter(loader)
    assert failed == 0 and got == 30
    st = served.status()
    assert st["worker_deaths"] == 1 and served.workers[0] not in st["workers"] and len(st["workers"]) == 2
    loader.coordinator.close()
    assert served.stop() == 0 and alive(st["workers"]) == []
