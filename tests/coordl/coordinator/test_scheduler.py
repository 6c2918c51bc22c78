"""scheduler.py without processes: holds, the K-batch bound, joiners, stragglers, the end."""

from coordl.coordinator import protocol as p
from coordl.coordinator.plan import Plan
from coordl.coordinator.ring import SlotTable
from coordl.coordinator.scheduler import Scheduler


def make(items=12, batch=4, slots=2, epochs=None, min_jobs=1):
    return Scheduler(Plan(items, batch, epochs=epochs), SlotTable(slots), min_jobs)


def fill(s, now=0.0):
    """Prepare (and publish at once) everything the scheduler wants now."""
    replies = []
    while (claim := s.to_prepare(now)) is not None:
        slot, index = claim
        replies += s.published(slot, s.plan.batch_len(index))
    return replies


def test_min_jobs_holds_production_back():
    s = make(min_jobs=2)
    a = s.attach(pid=1, now=0)
    assert s.to_prepare(0) is None
    s.attach(pid=2, now=0)
    assert s.to_prepare(0) == (0, 0) and a.start_epoch == 0


def test_fastest_job_runs_at_most_k_batches_ahead():
    s = make(slots=2)
    fast, slow = s.attach(1, 0), s.attach(2, 0)
    for job in (fast, slow):
        assert s.begin(job.id, 0) == p.EpochStart(0, 3)
    fill(s)
    got = []
    for _ in range(3):
        reply = s.next(fast.id, 0)
        if reply is None:
            break
        got.append(reply.index)
        s.release(fast.id, reply.index, 0)
        fill(s)
    assert got == [0, 1]  # the slow job still holds batch 0: the ring (K=2) is full
    assert s.next(slow.id, 0) == p.Ready(0, 0, 0, 4)
    s.release(slow.id, 0, 0)
    assert fill(s) == [(fast.id, p.Ready(2, 0, 0, 4))]  # the waiting fast job is woken


def test_detaching_releases_holds_and_unblocks_the_others():
    s = make(slots=2)
    fast, dead = s.attach(1, 0), s.attach(2, 0)
    s.begin(fast.id, 0)
    s.begin(dead.id, 0)
    fill(s)
    for index in (0, 1):
        assert s.next(fast.id, 0).index == index
        s.release(fast.id, index, 0)
    assert s.next(fast.id, 0) is None
    s.detach(dead.id)
    assert fill(s) == [(fast.id, p.Ready(2, 0, 0, 4))]


def test_late_joiner_gets_whole_epochs_and_holds_prefetched_ones():
    s = make(slots=3)
    a = s.attach(1, 0)
    s.begin(a.id, 0)
    fill(s)  # batches 0, 1, 2: all of epoch 0 is still in the ring
    assert s.join_epoch() == 0
    s.next(a.id, 0)
    s.release(a.id, 0, 0)
    fill(s)  # batch 0 is gone, batch 3 (epoch 1) prepared
    b = s.attach(2, 0)
    assert b.start_epoch == 1 and b.cursor == 3
    assert s.slots.holders[s.slots.by_index[3]] == {a.id, b.id}  # it holds what was prefetched
    for index in range(1, 3):
        s.next(a.id, 0)
        s.release(a.id, index, 0)
        fill(s)
    assert s.next(a.id, 0) == p.EndOfEpoch(0)
    assert s.begin(b.id, 0) == p.EpochStart(1, 3) and s.next(b.id, 0).index == 3


def test_begin_mid_epoch_skips_the_rest():
    s = make(slots=3)
    a, b = s.attach(1, 0), s.attach(2, 0)
    s.begin(a.id, 0)
    s.begin(b.id, 0)
    fill(s)
    assert s.begin(a.id, 0) == p.EpochStart(1, 3)  # a leaves epoch 0 at once
    assert all(a.id not in s.slots.holders[slot] for slot in s.slots.by_index.values())


def test_failed_batch_is_delivered_as_an_error_and_released():
    s = make()
    a = s.attach(1, 0)
    s.begin(a.id, 0)
    slot, index = s.to_prepare(0)
    assert s.next(a.id, 0) is None
    assert s.failed(slot, "cat.jpg: truncated") == [(a.id, p.BatchFailed(0, "cat.jpg: truncated"))]
    assert s.slots.free_slot() is not None and s.slots.by_index == {}


def test_straggler_is_the_idle_holder_of_the_oldest_slot_of_a_full_ring():
    s = make(slots=2)
    idle, busy = s.attach(1, 0), s.attach(2, 0)
    s.begin(idle.id, 0)
    s.begin(busy.id, 0)
    fill(s, now=0)
    for index in (0, 1):
        s.next(busy.id, 1)
        s.release(busy.id, index, 1)
    fill(s, now=1)  # full: the producer waits from t=1
    assert s.stragglers(now=5, timeout=10) == []
    assert s.stragglers(now=12, timeout=10) == [idle.id]


def test_finished_when_no_job_could_get_a_whole_epoch():
    s = make(epochs=1)
    assert not s.finished()
    a = s.attach(1, 0)
    s.begin(a.id, 0)
    for index in range(3):
        fill(s)
        s.next(a.id, 0)
        s.release(a.id, index, 0)
    assert s.next(a.id, 0) == p.EndOfEpoch(0)
    assert isinstance(s.begin(a.id, 0), p.Refused)
    assert isinstance(s.attach(2, 0), str)
    s.detach(a.id)
    assert s.finished()
