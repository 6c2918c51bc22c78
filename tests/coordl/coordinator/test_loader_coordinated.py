"""coordl.DataLoader(coordinator=...) in this process against a real daemon process."""

from __future__ import annotations

import gc
import os
import shutil
import socket
import struct
import sys
import time
import warnings

import msgpack
import pytest
import torch

import coordl
from coordl.coordinator import protocol as p
from coordl.coordinator.client import status
from coordl.coordinator.plan import Plan

FAILING_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "failing_worker_serve.py")


def _loader(root, served, batch_size=4, size=32, transform="train", seed=0, on_error="raise", **kw):
    ds = coordl.ImageFolder(root, transform=transform, size=size, seed=seed, on_error=on_error)
    kw.setdefault("shuffle", True)
    kw.setdefault("timeout", 60)  # a hang fails the test instead of waiting for ever
    return coordl.DataLoader(ds, batch_size=batch_size, coordinator=served.address, **kw)


def test_batches_are_the_plan_with_the_local_pixels(tiny_root, serve):
    served = serve(tiny_root, seed=5)
    loader = _loader(tiny_root, served, seed=5)
    assert len(loader) == 10 and isinstance(loader, torch.utils.data.DataLoader)
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=5)
    plan = Plan(40, 4, seed=5)
    for epoch in range(2):
        seen = 0
        for k, batch in enumerate(loader):
            images, labels = batch
            assert loader.epoch == batch.epoch == epoch
            assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
            assert images.is_contiguous(memory_format=torch.channels_last)
            assert batch.indices.tolist() == plan.batch(epoch * 10 + k).tolist()
            for row, item in enumerate(batch.indices.tolist()):
                local, label = ds.prep(ds.fetch(item), item, epoch)
                assert torch.equal(images[row], local)  # same augmentation as a local loader
                assert labels[row] == label
            seen += 1
        assert seen == 10
    loader.coordinator.close()


def test_pin_memory_gives_batches_of_their_own(tiny_root, shared_serve):
    served = shared_serve
    views, copies = _loader(tiny_root, served), _loader(tiny_root, served, pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no accelerator here
        kept = []
        for (a, ya), (b, yb) in zip(views, copies):
            assert torch.equal(a, b) and torch.equal(ya, yb)
            assert b.is_contiguous(memory_format=torch.channels_last)
            kept.append((b, b.clone()))
    for b, snapshot in kept:  # the copies outlive their slots unchanged
        assert torch.equal(b, snapshot)
    views.coordinator.close()
    copies.coordinator.close()


def test_drop_last_and_len(tiny_root, serve):
    served = serve(tiny_root, batch_size=6, drop_last=True)
    loader = _loader(tiny_root, served, batch_size=6, drop_last=True)
    assert len(loader) == 6
    sizes = [x.shape[0] for x, _ in loader]
    assert sizes == [6] * 6
    served2 = serve(tiny_root, batch_size=6, name="keep.sock")
    loader2 = _loader(tiny_root, served2, batch_size=6)
    assert len(loader2) == 7 and [x.shape[0] for x, _ in loader2][-1] == 4


@pytest.mark.parametrize("change, words", [
    (dict(seed=5), ["seed=5 (job) != the daemon's seed=0 (--seed 0)", "coordl serve --seed 5"]),
    (dict(on_error="skip"), ["on_error='skip' (job) != the daemon's on_error='raise' "
                             "(--on-error raise)", "coordl serve --on-error skip"]),
    (dict(size=48), ["size=48 (job) != the daemon's size=32 (--size 32)"]),
    (dict(transform="val"), ["transform='val' (job) != the daemon's transform='train' "
                             "(--transform train)"]),
    (dict(shuffle=False), ["shuffle=False (job) != the daemon's shuffle=True (--shuffle)",
                           "coordl serve --no-shuffle"]),
])
def test_every_difference_that_changes_a_batch_is_refused_naming_it(tiny_root, shared_serve, change, words):
    served = shared_serve
    with pytest.raises(coordl.CoordinatorError) as err:
        _loader(tiny_root, served, **change)
    assert "differs from the coordinator in 1 thing that changes a batch" in str(err.value)
    for word in words:
        assert word in str(err.value)
    assert status(served.socket)["jobs"] == []


def test_all_differences_are_named_at_once(tiny_root, photo_root, serve):
    served = serve(tiny_root, seed=3, on_error="skip", drop_last=True)
    with pytest.raises(coordl.CoordinatorError) as err:
        _loader(photo_root, served, seed=4, batch_size=5, shuffle=False)
    text = str(err.value)
    assert "in 6 things that change a batch" in text
    for word in ["dataset fingerprint", "(40 items in", "the daemon's", "seed=4 (job) != the daemon's seed=3",
                 "on_error='raise' (job) != the daemon's on_error='skip'",
                 "batch_size=5 (job) != the daemon's batch_size=4", "shuffle=False (job)",
                 "drop_last=False (job) != the daemon's drop_last=True (--drop-last)",
                 "coordl serve --seed 4 --on-error raise --batch-size 5 --no-shuffle --keep-last"]:
        assert word in text, word
    assert len(_loader(tiny_root, served, seed=3, on_error="skip", drop_last=True)) == 10  # the same: in


def test_another_dataset_is_refused_by_fingerprint(tiny_root, photo_root, shared_serve, tmp_path):
    served = shared_serve
    with pytest.raises(coordl.CoordinatorError, match="dataset fingerprint .* != .*same dataset folder"):
        _loader(photo_root, served)
    copy = str(tmp_path / "copy")
    shutil.copytree(tiny_root, copy)
    os.utime(os.path.join(copy, sorted(os.listdir(copy))[0]))
    first = os.path.join(copy, sorted(os.listdir(copy))[0])
    with open(os.path.join(first, sorted(os.listdir(first))[0]), "ab") as f:
        f.write(b"\0")  # one file changed: a different dataset
    with pytest.raises(coordl.CoordinatorError, match="fingerprint"):
        _loader(copy, served)


def test_no_daemon_and_bad_arguments(tiny_root, sockdir):
    with pytest.raises(coordl.CoordinatorError, match="no coordinator listens on .*coordl serve"):
        _loader(tiny_root, type("S", (), {"address": f"unix://{sockdir}/none.sock"}))
    with pytest.raises(coordl.ConfigError, match="sampler"):
        coordl.DataLoader(coordl.ImageFolder(tiny_root), batch_size=4, sampler=range(40),
                          coordinator=f"unix://{sockdir}/none.sock")
    with pytest.raises(coordl.ConfigError, match="only unix://"):
        coordl.DataLoader(coordl.ImageFolder(tiny_root), batch_size=4, coordinator="tcp://x:1")
    with pytest.raises(coordl.ConfigError, match="transform"):
        coordl.DataLoader(coordl.ImageFolder(tiny_root, transform=None), batch_size=4,
                          coordinator=f"unix://{sockdir}/none.sock")


def test_straggler_is_detached_and_told_so(tiny_root, serve):
    served = serve(tiny_root, slots=2, straggler_timeout=1)
    slow, fast = _loader(tiny_root, served), _loader(tiny_root, served)
    slow_epoch = iter(slow)
    next(slow_epoch)  # holds batch 0 (and 1, asked for ahead): the whole ring of 2, then stalls
    # a count, not a clock: fast can have batch 2 only once a slot is freed, and slow never
    # frees one, so fast's 10 batches prove the daemon detached slow (and only slow)
    assert len([x for x, _ in fast]) == 10
    st = status(served.socket)
    assert st["detached"] == 1 and [j["job"] for j in st["jobs"]] == [fast.coordinator.job]
    assert (f"job {slow.coordinator.job} (pid {os.getpid()}) detached: straggler: held the ring "
            "past --straggler-timeout") in served.log_text()
    with pytest.raises(coordl.CoordinatorError, match="straggler.*--straggler-timeout 1 s"):
        next(slow_epoch)
    with pytest.raises(coordl.CoordinatorError, match="straggler"):
        iter(slow)  # and every later call
    assert len(status(served.socket)["jobs"]) == 1
    assert len([x for x, _ in fast]) == 10  # the others go on


def test_late_joiner_starts_at_the_next_epoch(tiny_root, serve):
    served = serve(tiny_root, slots=3)
    first = _loader(tiny_root, served)
    it = iter(first)
    for _ in range(4):
        next(it)
    late = _loader(tiny_root, served)
    assert late.coordinator.welcome.start_epoch == 1
    assert len(list(it)) == 6  # the first job's epoch 0 goes on without waiting for it
    a, b = iter(first), iter(late)
    assert first.epoch == late.epoch == 1
    ids_a, ids_b = [], []
    for (batch_a, batch_b) in zip(a, b):
        ids_a += batch_a.indices.tolist()
        ids_b += batch_b.indices.tolist()
        assert torch.equal(batch_a[0], batch_b[0])
    assert ids_a == ids_b and sorted(ids_a) == list(range(40))


def test_leaving_an_epoch_early_gives_up_its_rest(tiny_root, serve):
    served = serve(tiny_root, slots=3)
    loader, other = _loader(tiny_root, served), _loader(tiny_root, served)
    it = iter(loader)
    for _ in range(2):
        next(it)
    it = iter(loader)  # on to epoch 1: the rest of epoch 0 is released at once
    assert loader.epoch == 1
    other_ids = [i for b in other for i in b.indices.tolist()]  # not blocked by the quitter
    assert other.epoch == 0 and sorted(other_ids) == list(range(40))
    other.coordinator.close()
    ids = [i for b in it for i in b.indices.tolist()]
    assert sorted(ids) == list(range(40))


def test_epochs_run_out(tiny_root, serve):
    served = serve(tiny_root, epochs=1)
    loader = _loader(tiny_root, served)
    assert len(list(loader)) == 10
    with pytest.raises(coordl.CoordinatorError, match="this job has had its 1 epochs"):
        iter(loader)
    assert served.wait() == 0  # nobody attached, nothing left to serve


def _until(predicate, what: str, timeout: float = 30.0) -> None:
    """Wait (polling the daemon) until `predicate()` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


def test_a_loader_left_by_break_and_del_detaches_and_the_next_one_runs(tiny_root, serve):
    served = serve(tiny_root, slots=2)
    gc.disable()  # dropping the last reference must detach, not a garbage collection later
    try:
        first = _loader(tiny_root, served)
        for k, _batch in enumerate(first):
            if k == 2:
                break
        del first
        _until(lambda: not served.status()["jobs"], "the dropped loader detached")
        second = _loader(tiny_root, served, timeout=20)  # it ran into the first one's ring before
        assert sorted(i for b in second for i in b.indices.tolist()) == list(range(40))
        second.coordinator.close()
    finally:
        gc.enable()


def test_an_abandoned_iterator_lets_go_of_the_ring_and_its_loader_goes_on(tiny_root, serve):
    served = serve(tiny_root, slots=2)
    loader = _loader(tiny_root, served)
    for k, _batch in enumerate(loader):
        if k == 2:
            break
    # the loader lives on, its iterator is gone: its job holds nothing until its next epoch
    _until(lambda: served.status()["jobs"][0]["paused"], "the job paused")
    assert served.status()["jobs"][0]["holding"] == []
    other = _loader(tiny_root, served, timeout=20)
    assert sorted(i for b in other for i in b.indices.tolist()) == list(range(40))
    assert other.epoch == 1  # epoch 0 was under way when it attached
    other.coordinator.close()
    plan = Plan(40, 4)
    batches = [b.indices.tolist() for b in loader]  # the next epoch, whole, though the others went on
    assert loader.epoch == 1
    assert batches == [plan.batch(10 + k).tolist() for k in range(10)]
    loader.coordinator.close()


def test_a_job_that_leaves_with_epochs_to_go_is_waited_for_and_resumes(tiny_root, serve):
    served = serve(tiny_root, epochs=1)
    loader = _loader(tiny_root, served)
    it = iter(loader)
    seen = [next(it).indices.tolist() for _ in range(3)]
    state = loader.state_dict()  # preempted after 3 of 10 batches
    del it
    loader.coordinator.close()
    _until(lambda: served.status()["owed"] == 1, "the daemon counted the preempted job")
    assert served.proc.poll() is None and not served.status()["jobs"]
    resumed = _loader(tiny_root, served)  # as in a new process: the same state
    resumed.load_state_dict(state)
    assert served.status()["owed"] == 0
    rest = [b.indices.tolist() for b in resumed]
    plan = Plan(40, 4)
    assert seen + rest == [plan.batch(k).tolist() for k in range(10)]
    resumed.coordinator.close()
    assert served.wait() == 0  # its one epoch done: the daemon stops at once
    assert "every job has had its 1 epochs and left" in served.log_text()


def test_a_daemon_stops_linger_seconds_after_a_job_left_with_epochs_to_go(tiny_root, serve):
    served = serve(tiny_root, epochs=1, linger=0.5)
    loader = _loader(tiny_root, served)
    next(iter(loader))
    loader.coordinator.close()
    assert served.wait() == 0
    assert "no job resumed within --linger 0.5 s after 1 left with epochs to go" in served.log_text()


def test_daemon_refuses_garbage_and_keeps_serving(tiny_root, shared_serve):
    served = shared_serve

    def exchange(payload: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(served.socket)
            s.sendall(payload)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

    def frame(obj) -> bytes:
        body = msgpack.packb(obj)
        return struct.pack(">I", len(body)) + body

    for payload, reason in [
        (struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1", b"not valid msgpack"),
        (struct.pack(">I", 2**31), b"over the limit"),
        (frame([1, 2, 3]), b"not a map"),
        (frame({"type": "__reduce__"}), b"is not one of"),
        (frame({"type": "release", "index": "7"}), b"is not <class 'int'>"),
        (frame({"type": "next"}), b"before 'hello'"),
        (frame({"type": "hello", "version": 1}), b"expected"),
    ]:
        reply = exchange(payload)
        msg = p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(reply)
        assert isinstance(msg[0], p.Refused) and reason.decode() in msg[0].reason
    pickled = b"\x80\x04\x95" + os.urandom(64)  # a pickle is not a frame either
    exchange(struct.pack(">I", len(pickled)) + pickled)
    assert status(served.socket)["pid"] == served.pid  # still serving
    assert len([x for x, _ in _loader(tiny_root, served)]) == 10


def test_a_bad_image_fails_its_batch_in_the_jobs_or_is_skipped(tiny_root, serve, tmp_path, drain):
    root = str(tmp_path / "bad")
    shutil.copytree(tiny_root, root)
    cls = os.path.join(root, sorted(os.listdir(root))[0])
    broken = os.path.join(cls, sorted(os.listdir(cls))[0])
    with open(broken, "wb") as f:
        f.write(b"not a jpeg at all")
    served = serve(root, batch_size=8)
    loader = _loader(root, served, batch_size=8)
    got, errors = drain(loader)
    assert len(errors) == 1 and os.path.basename(broken) in errors[0] and got == 32
    assert "could not be prepared by the coordinator: SampleError: " + broken in errors[0]
    # one epoch only: a daemon serving more would start preparing the next epoch (and skip
    # the broken file again) while this job is still reading the first
    skipping = serve(root, batch_size=8, on_error="skip", name="skip.sock", epochs=1)
    loader = _loader(root, skipping, batch_size=8, on_error="skip")
    rows, ids = 0, []
    for batch in loader:  # a batch's views are valid until the next one is asked for
        rows += batch[0].shape[0]
        ids += batch.indices.tolist()
    assert rows == 39 and sorted(ids) == [i for i in range(40) if i != 0]
    assert status(skipping.socket)["counters"]["errors_skipped"] == 1
    stats = loader.stats()
    assert stats["daemon_errors_skipped"] == 1 and stats["samples"] == 39 == stats["daemon_samples"]


def test_an_internal_error_in_a_prep_worker_is_a_coordinator_error_with_its_traceback(tiny_root, serve):
    # a bug (not a bad sample) in a prep worker: the job gets CoordinatorError with the worker's
    # traceback and the item it was at; `except SampleError` (on_error's territory) does not hide it
    served = serve(tiny_root, program=[sys.executable, FAILING_WORKER], batch_size=8, epochs=1)
    loader = _loader(tiny_root, served, batch_size=8)
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
    bad = Plan(40, 8, seed=0).order(0).tolist().index(5) // 8  # the batch that holds item 5
    got, errors = 0, []
    it = iter(loader)
    while True:
        try:
            got += next(it)[0].shape[0]
        except StopIteration:
            break
        except coordl.SampleError as e:  # pragma: no cover - the failure this test rules out
            pytest.fail(f"an internal error came as a SampleError: {e}")
        except coordl.CoordinatorError as e:
            errors.append(str(e))
    assert got == 32 and len(errors) == 1, errors
    text = errors[0]
    assert f"batch {bad} of epoch 0 could not be prepared by the coordinator: an internal error at " \
           f"item 5 ({ds.manifest.path(5)}): RuntimeError: a bug in prep_into at item 5" in text
    assert "The prep worker's traceback:\nTraceback (most recent call last):" in text
    assert "failing_worker_serve.py" in text and "in prep_rows" in text  # the worker's frames
    assert loader.stats()["failed_batches"] == 1
    assert "a bug in prep_into at item 5" in served.log_text()  # logged by the daemon too


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_local_loader_yields_the_daemons_batches(tiny_root, serve, drop_last):
    # one plan everywhere: a local coordl.DataLoader (shuffle=True, no generator or sampler)
    # gives the same batches as a coordinated job, in order, pixels and labels
    served = serve(tiny_root, seed=5, batch_size=6, drop_last=drop_last or None)
    coordinated = _loader(tiny_root, served, seed=5, batch_size=6, drop_last=drop_last)
    locals_ = [coordl.DataLoader(coordl.ImageFolder(tiny_root, transform="train", size=32, seed=5),
                                 batch_size=6, shuffle=True, drop_last=drop_last, num_workers=w)
               for w in (0, 2)]
    for epoch in range(2):
        got = [(b.indices.tolist(), b[0].clone(), b[1].clone()) for b in coordinated]
        assert coordinated.epoch == epoch and len(got) == (6 if drop_last else 7)
        order = [i for ids, _, _ in got for i in ids]
        for local in locals_:
            assert local.epoch_indices(epoch)[:len(order)] == order  # drop_last: the tail is cut
            batches = list(local)
            assert local.epoch == epoch and len(batches) == len(got)
            for (_ids, images, labels), (local_images, local_labels) in zip(got, batches):
                assert torch.equal(images, local_images)  # same items, same augmentation
                assert torch.equal(labels, local_labels)
    coordinated.coordinator.close()


def test_stats_report_this_job_and_the_daemon_and_set_epoch_cannot_position(tiny_root, serve):
    served = serve(tiny_root, epochs=1)  # the daemon prepares exactly this job's one epoch
    loader = _loader(tiny_root, served)
    loader.set_epoch(0)  # the epoch it runs next anyway: accepted
    with pytest.raises(coordl.CoordinatorError, match=r"set_epoch\(3\): a coordinated job cannot "
                       r"be positioned: .* this job's next one is epoch 0"):
        loader.set_epoch(3)
    rows = sum(images.shape[0] for images, _ in loader)
    stats = loader.stats()
    assert rows == 40
    assert (stats["batches"], stats["samples"], stats["failed_batches"]) == (10, 40, 0)
    assert stats["daemon_batches"] == 10 and stats["daemon_samples"] == 40
    assert stats["daemon_storage_reads"] == 40 and stats["daemon_decodes"] == 40
    assert stats["daemon_storage_bytes"] == sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tiny_root) for f in fs)
    assert stats["daemon_errors_skipped"] == 0 and stats["daemon_cache_hits"] == 0
    assert "daemon_cache_bytes" not in stats  # the daemon runs without --cache
    with pytest.raises(coordl.CoordinatorError, match="next one is epoch 1"):
        loader.set_epoch(0)
    loader.coordinator.close()
