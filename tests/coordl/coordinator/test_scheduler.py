"""scheduler.py without processes: holds, the K-batch bound, the join window, per-job epochs,
joiners, stragglers, the end."""

from coordl.coordinator import protocol as p
from coordl.coordinator.plan import Plan
from coordl.coordinator.ring import SlotTable
from coordl.coordinator.scheduler import Scheduler


def make(items=12, batch=4, slots=2, epochs=None, min_jobs=1, join_window=0.0):
    return Scheduler(Plan(items, batch, epochs=epochs), SlotTable(slots), min_jobs, join_window)


def fill(s, now=0.0):
    """Prepare (and publish at once) everything the scheduler wants now."""
    replies = []
    while (claim := s.to_prepare(now)) is not None:
        slot, index = claim
        replies += s.published(slot, s.plan.batch_len(index))
    return replies


def attach(s, pid, now=0.0):
    """Attach and let the (zero-length) join window close, as the daemon's loop does."""
    job = s.attach(pid, now)
    s.tick(now)
    return job


def take(s, job, now=0.0):
    """The job's next batch, released at once; its index (None: it must wait)."""
    reply = s.next(job.id, now)
    if not isinstance(reply, p.Ready):
        return reply
    s.release(job.id, reply.index, now)
    fill(s, now)
    return reply.index


def test_min_jobs_holds_the_first_batch_back():
    s = make(min_jobs=2)
    a = s.attach(pid=1, now=0)
    s.begin(a.id, 0)
    assert s.to_prepare(0) == (0, 0)  # batches are prepared meanwhile ...
    s.published(0, 4)
    assert s.next(a.id, 0) is None and s.tick(100) == []  # ... but none is handed out
    b = s.attach(pid=2, now=100)
    assert b.start_epoch == 0 and s.slots.holders[0] == {a.id, b.id}
    assert s.tick(100) == [(a.id, p.Ready(0, 0, 0, 4))]


def test_join_window_starts_every_job_of_a_group_at_the_same_epoch():
    s = make(slots=3, join_window=5.0)
    a = s.attach(1, now=0)
    s.begin(a.id, 0)
    assert fill(s, 0) == [] and s.next(a.id, 0) is None  # prepared, held back
    assert s.tick(4.9) == []
    b = s.attach(2, now=4.0)  # every attach restarts the window
    assert s.tick(8.9) == [] and s.gathering
    assert b.start_epoch == a.start_epoch == 0
    assert all(s.slots.holders[slot] == {a.id, b.id} for slot in range(3))
    assert s.stragglers(now=1000, timeout=1) == []  # nobody can move while the window holds
    assert s.tick(9.0) == [(a.id, p.Ready(0, 0, 0, 4))]  # the waiting job gets its batch
    s.begin(b.id, 9)
    assert s.next(b.id, 9) == p.Ready(0, 0, 0, 4)
    c = s.attach(3, now=9.5)  # batch 0 of epoch 0 is still in the ring: c joins epoch 0 too
    assert c.start_epoch == 0 and not s.gathering
    s.begin(c.id, 9.5)
    for job in (a, b, c):
        s.release(job.id, 0, 10)
        if job is c:
            assert s.next(c.id, 10) == p.Ready(0, 0, 0, 4)
            s.release(c.id, 0, 10)
    d = s.attach(4, now=10)  # batch 0 has left the ring: the next boundary, at once
    assert d.start_epoch == 1 and not s.gathering


def test_a_new_group_gets_a_new_window():
    s = make(join_window=2.0)
    a = s.attach(1, 0)
    s.tick(2)
    s.detach(a.id)
    assert not s.gathering
    b = s.attach(2, 10)
    s.begin(b.id, 10)
    fill(s, 10)
    assert s.gathering and s.next(b.id, 10) is None
    assert s.tick(12) == [(b.id, p.Ready(0, 0, 0, 4))]


def test_fastest_job_runs_at_most_k_batches_ahead():
    s = make(slots=2)
    fast, slow = attach(s, 1), attach(s, 2)
    for job in (fast, slow):
        assert s.begin(job.id, 0) == p.EpochStart(0, 3)
    fill(s)
    got = []
    for _ in range(3):
        index = take(s, fast)
        if index is None:
            break
        got.append(index)
    assert got == [0, 1]  # the slow job still holds batch 0: the ring (K=2) is full
    assert s.next(slow.id, 0) == p.Ready(0, 0, 0, 4)
    s.release(slow.id, 0, 0)
    assert fill(s) == [(fast.id, p.Ready(2, 0, 0, 4))]  # the waiting fast job is woken


def test_detaching_releases_holds_and_unblocks_the_others():
    s = make(slots=2)
    fast, dead = attach(s, 1), attach(s, 2)
    s.begin(fast.id, 0)
    s.begin(dead.id, 0)
    fill(s)
    assert [take(s, fast), take(s, fast), take(s, fast)] == [0, 1, None]
    s.detach(dead.id)
    assert fill(s) == [(fast.id, p.Ready(2, 0, 0, 4))]


def test_late_joiner_gets_whole_epochs_and_holds_prefetched_ones():
    s = make(slots=3)
    a = attach(s, 1)
    s.begin(a.id, 0)
    fill(s)  # batches 0, 1, 2: all of epoch 0 is still in the ring
    assert s.join_epoch() == 0
    assert take(s, a) == 0  # batch 0 is gone, batch 3 (epoch 1) prepared
    b = attach(s, 2)
    assert b.start_epoch == 1 and b.cursor == 3
    assert s.slots.holders[s.slots.by_index[3]] == {a.id, b.id}  # it holds what was prefetched
    assert [take(s, a), take(s, a)] == [1, 2]
    assert s.next(a.id, 0) == p.EndOfEpoch(0)
    assert s.begin(b.id, 0) == p.EpochStart(1, 3) and s.next(b.id, 0).index == 3


def run_epoch(s, job, epoch):
    assert s.begin(job.id, 0) == p.EpochStart(epoch, 3)
    got = [take(s, job) for _ in range(4)]
    assert got[-1] == p.EndOfEpoch(epoch)
    return got[:-1]


def test_epochs_are_counted_per_job():
    s = make(slots=8, epochs=2)  # 3 batches per epoch
    a = attach(s, 1)
    assert (a.start_epoch, a.end) == (0, 6)
    s.begin(a.id, 0)
    fill(s)
    assert sorted(s.slots.by_index) == [0, 1, 2, 3, 4, 5]  # nobody needs batch 6
    assert take(s, a) == 0
    b = attach(s, 2)  # epoch 0 under way: b starts with epoch 1 and gets epochs 1 and 2
    assert (b.start_epoch, b.cursor, b.end) == (1, 3, 9)
    fill(s)
    assert sorted(s.slots.by_index) == [1, 2, 3, 4, 5]  # b has not begun: nothing for it yet
    assert s.begin(b.id, 0) == p.EpochStart(1, 3)
    fill(s)
    assert sorted(s.slots.by_index) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert s.slots.holders[s.slots.by_index[3]] == {a.id, b.id}
    assert s.slots.holders[s.slots.by_index[6]] == {b.id}  # past a's end: b's only
    assert [take(s, a), take(s, a), take(s, a)] == [1, 2, p.EndOfEpoch(0)]
    assert run_epoch(s, a, 1) == [3, 4, 5]
    assert isinstance(s.begin(a.id, 0), p.Refused)  # a has had its 2 epochs
    s.detach(a.id)
    assert [take(s, b) for _ in range(4)] == [3, 4, 5, p.EndOfEpoch(1)]
    assert run_epoch(s, b, 2) == [6, 7, 8]
    refused = s.begin(b.id, 0)
    assert isinstance(refused, p.Refused)
    assert "had its 2 epochs" in refused.reason and "epochs 1-2" in refused.reason
    assert s.to_prepare(0) is None  # nobody needs batch 9
    assert not s.finished()
    s.detach(b.id)
    assert s.finished()


def test_a_job_past_its_end_holds_nothing():
    s = make(slots=3, epochs=1)
    a = attach(s, 1)
    s.begin(a.id, 0)
    fill(s)
    assert take(s, a) == 0
    b = attach(s, 2)  # starts with epoch 1: a (done after epoch 0) must not hold its batches
    for _ in range(2):
        take(s, a)
    fill(s)
    assert s.next(a.id, 0) == p.EndOfEpoch(0)
    for index, slot in s.slots.by_index.items():
        assert a.id not in s.slots.holders[slot], index
    assert b.end == 6 and s.begin(b.id, 0) == p.EpochStart(1, 3)


def test_begin_mid_epoch_skips_the_rest():
    s = make(slots=3)
    a, b = attach(s, 1), attach(s, 2)
    s.begin(a.id, 0)
    s.begin(b.id, 0)
    fill(s)
    assert s.begin(a.id, 0) == p.EpochStart(1, 3)  # a leaves epoch 0 at once
    assert all(a.id not in s.slots.holders[slot] for slot in s.slots.by_index.values())


def test_failed_batch_is_delivered_as_an_error_and_released():
    s = make()
    a = attach(s, 1)
    s.begin(a.id, 0)
    slot, index = s.to_prepare(0)
    assert s.next(a.id, 0) is None
    failure = p.Failure("sample", "SampleError: cat.jpg: truncated", 3, "cat.jpg", "Traceback ...")
    assert s.failed(slot, failure) == [(a.id, p.BatchFailed(0, "sample", "SampleError: cat.jpg: truncated",
                                                            3, "cat.jpg", "Traceback ..."))]
    assert s.slots.free_slot() is not None and s.slots.by_index == {}


def test_straggler_is_the_idle_holder_of_the_oldest_slot_of_a_full_ring():
    s = make(slots=2)
    idle, busy = attach(s, 1), attach(s, 2)
    s.begin(idle.id, 0)
    s.begin(busy.id, 0)
    fill(s, now=0)
    for index in (0, 1):
        s.next(busy.id, 1)
        s.release(busy.id, index, 1)
    fill(s, now=1)  # full: the producer waits from t=1
    assert s.stragglers(now=5, timeout=10) == []
    assert s.stragglers(now=12, timeout=10) == [idle.id]


def test_finished_once_a_group_started_and_every_job_left():
    s = make(epochs=1)
    assert not s.finished()
    a = s.attach(1, 0)
    s.detach(a.id)
    assert not s.finished()  # it left before its group started: keep serving
    a = attach(s, 1)
    s.begin(a.id, 0)
    fill(s)
    assert [take(s, a) for _ in range(4)] == [0, 1, 2, p.EndOfEpoch(0)]
    assert isinstance(s.begin(a.id, 0), p.Refused)
    s.detach(a.id)
    assert s.finished()
    assert not make().finished()  # without --epochs: until stopped


def test_a_job_that_leaves_with_epochs_to_go_is_waited_for_until_it_resumes_or_linger_passes():
    s = make(epochs=1)
    a = attach(s, 1)
    s.begin(a.id, 0)
    fill(s)
    assert [take(s, a), take(s, a)] == [0, 1]  # 2 of its 3 batches: preempted
    s.detach(a.id, now=10)
    assert s.owed == 1
    assert not s.finished(now=10, linger=60) and not s.finished(now=69.9, linger=60)
    assert s.finished(now=70, linger=60)  # nobody came back within --linger
    back = attach(s, 2, now=20)  # the job again, in a new process, from its checkpoint
    assert s.resume(back.id, 0, 2, 0) == p.Resumed(0, 0, 2)
    assert s.owed == 0
    s.begin(back.id, 20)
    fill(s, 20)
    assert [take(s, back, 20), take(s, back, 20)] == [2, p.EndOfEpoch(0)]
    s.detach(back.id, now=21)
    assert s.owed == 0 and s.finished(now=21, linger=60)  # it had its epoch: done at once


def test_a_paused_job_holds_and_needs_nothing_until_its_next_begin():
    s = make(items=16, slots=2)
    a, b = attach(s, 1), attach(s, 2)
    s.begin(a.id, 0)
    s.begin(b.id, 0)
    fill(s)
    assert isinstance(s.next(a.id, 0), p.Ready)  # a holds batch 0 and its run (batch 1)
    s.pause(a.id, 0)  # its iterator was dropped mid-epoch
    assert s.job_status(a, 0)["paused"] and a.holding == set()
    assert all(a.id not in h for h in s.slots.holders)
    assert isinstance(s.next(a.id, 0), p.Refused)  # no batch before its next Begin
    assert [take(s, b) for _ in range(5)] == [0, 1, 2, 3, p.EndOfEpoch(0)]  # not held back by a
    assert s.begin(a.id, 0) == p.EpochStart(1, 4)  # the rest of epoch 0 given up
    assert not a.paused
    s.detach(b.id)  # (b between epochs holds epoch 1's first batches, as any job in step)
    assert [take(s, a) for _ in range(5)] == [4, 5, 6, 7, p.EndOfEpoch(1)]


# -- resume (client.py load_state_dict): a job moved to a checkpoint's batch --
class Sim:
    """Jobs that take batches in turns, each released at once; the producer publishes at once."""

    def __init__(self, s):
        self.s, self.woken, self.got = s, {}, {}

    def fill(self):
        for job_id, reply in fill(self.s):
            self.woken[job_id] = reply

    def step(self, job):
        """One batch for `job`: its index, EndOfEpoch, or None (it waits). A job that waits has
        asked already (its Next is answered when the batch is published), as client.py's do."""
        reply = self.woken.pop(job.id, None) or (None if job.waiting else self.s.next(job.id, 0))
        if isinstance(reply, p.Ready):
            self.got.setdefault(job.id, []).append(reply.index)
            self.s.release(job.id, reply.index, 0)
        self.fill()
        return reply.index if isinstance(reply, p.Ready) else reply


def test_resume_at_a_batch_still_in_the_ring_holds_it():
    s = make(items=40, slots=4)  # 10 batches per epoch
    sim = Sim(s)
    a = attach(s, 1)
    s.begin(a.id, 0)
    sim.fill()
    assert [sim.step(a) for _ in range(3)] == [0, 1, 2]  # the ring holds 3, 4, 5, 6
    b = attach(s, 2)
    assert s.resume(b.id, 0, 4, 0) == p.Resumed(0, 0, 4)
    assert (b.cursor, b.start_epoch) == (4, 0)
    assert all(b.id in s.slots.holders[s.slots.by_index[i]] for i in (4, 5, 6))
    assert b.id not in s.slots.holders[s.slots.by_index[3]]  # before its batch: not its
    assert s.begin(b.id, 0) == p.EpochStart(0, 6)  # the rest of epoch 0, not epoch 1
    produced = s.next_batch
    got = []
    while (r := sim.step(b)) != p.EndOfEpoch(0):
        got.append(r)
        sim.step(a)
    assert got == [4, 5, 6, 7, 8, 9]
    assert s.next_batch - produced <= 6  # nothing prepared twice: it was in step with a


def test_resume_at_a_batch_that_left_the_ring_prepares_it_again():
    s = make(items=40, slots=2)
    sim = Sim(s)
    a = attach(s, 1)
    s.begin(a.id, 0)
    sim.fill()
    assert [sim.step(a) for _ in range(7)] == list(range(7))  # the ring holds 7, 8
    b = attach(s, 2)  # a new job now would start with epoch 1
    assert b.start_epoch == 1
    assert s.resume(b.id, 0, 3, 0) == p.Resumed(0, 0, 3)
    assert all(b.id not in h for h in s.slots.holders)  # 3 is gone: it holds nothing ahead
    assert s.begin(b.id, 0) == p.EpochStart(0, 7)
    assert sim.step(b) is None and s.to_prepare(0) is None  # waits: the ring is full (a's)
    got, a_got = [], []
    for _ in range(100):  # both make progress: no deadlock with the ring full
        if (r := sim.step(b)) == p.EndOfEpoch(0):
            break
        if r is not None:
            got.append(r)
        if a_got[-1:] != [9] and isinstance(r := sim.step(a), int):
            a_got.append(r)
    assert got == [3, 4, 5, 6, 7, 8, 9]  # every batch it had not received, in order
    assert a_got == [7, 8, 9]            # a lost nothing either


def test_resumed_job_is_caught_up_and_then_shares_batches():
    s = make(items=40, slots=2)
    sim = Sim(s)
    a = attach(s, 1)
    s.begin(a.id, 0)
    sim.fill()
    for _ in range(5):
        sim.step(a)
    b = attach(s, 2)
    s.resume(b.id, 0, 1, 0)
    s.begin(b.id, 0)
    a_waits = 0
    while sim.step(b) != p.EndOfEpoch(0):  # the producer catches b up first: a waits meanwhile
        if sim.got[a.id][-1] != 9:
            a_waits += sim.step(a) is None
    assert sim.got[b.id] == list(range(1, 10)) and a_waits > 0
    while sim.step(a) != p.EndOfEpoch(0):
        pass
    assert sim.got[a.id] == list(range(10))
    prepared = s.next_batch
    s.begin(a.id, 0)
    s.begin(b.id, 0)
    for _ in range(10):
        assert sim.step(a) == sim.step(b)  # in step again: each batch of epoch 1 serves both
    assert s.next_batch - prepared <= 10


def test_resume_keeps_the_jobs_own_epochs():
    s = make(slots=8, epochs=2)  # 3 batches per epoch
    sim = Sim(s)
    a = attach(s, 1)
    s.begin(a.id, 0)
    sim.fill()
    for _ in range(4):
        sim.step(a)  # 0, 1, 2 and the end of epoch 0
    b = attach(s, 2)
    assert s.resume(b.id, 1, 2, 0) == p.Resumed(0, 1, 2)  # first epoch 0, at batch 2 of epoch 1
    assert b.end == 6  # epochs 0 and 1: its own count, not that of a job attaching now
    assert s.begin(b.id, 0) == p.EpochStart(1, 1)
    assert sim.step(b) == 5 and sim.step(b) == p.EndOfEpoch(1)
    refused = s.begin(b.id, 0)
    assert isinstance(refused, p.Refused) and "had its 2 epochs" in refused.reason


def test_resume_after_a_whole_epoch_starts_the_next_and_on_an_idle_daemon_prepares_from_there():
    s = make(items=40, slots=2)
    sim = Sim(s)
    b = attach(s, 1)
    assert s.resume(b.id, 4, 10, 2) == p.Resumed(2, 5, 0)  # epoch 4 received whole: epoch 5
    assert s.begin(b.id, 0) == p.EpochStart(5, 10)
    sim.fill()
    assert sorted(s.slots.by_index) == [50, 51]  # nothing below its batch is prepared
    assert sim.step(b) == 50
    c = attach(s, 2)  # a fresh job joins at the next boundary after what the ring holds
    assert c.start_epoch == 6


def test_resume_is_refused_after_begin_and_out_of_range():
    s = make(items=40)
    a = attach(s, 1)
    for args in ((0, 11, 0), (0, -1, 0), (1, 0, 2)):
        refused = s.resume(a.id, *args)
        assert isinstance(refused, p.Refused) and "0 <= first epoch <= epoch" in refused.reason
    s.begin(a.id, 0)
    refused = s.resume(a.id, 0, 3, 0)
    assert isinstance(refused, p.Refused) and "resume after this job began" in refused.reason


def test_resume_mid_epoch_past_the_jobs_epochs_is_refused():
    s = make(items=40, epochs=2)
    a = attach(s, 1)
    refused = s.resume(a.id, 2, 3, 0)  # epochs 0 and 1 were its own: epoch 2 is not
    assert isinstance(refused, p.Refused) and "had its 2 epochs" in refused.reason
    assert s.resume(a.id, 1, 3, 0) == p.Resumed(0, 1, 3)
