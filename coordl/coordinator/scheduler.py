"""Who gets which batch when: the daemon's job table and production decisions.

No I/O here: the daemon turns socket messages into calls on a `Scheduler` and
sends the messages it returns. That keeps the rules in one place and testable
without processes:

- A job's *cursor* is the next batch (global index, plan.py) it will be
  handed, its *end* the first batch after its last epoch (`Plan.end_batch`;
  None without --epochs). It needs every batch in [cursor, end), so when a
  batch is published its holders are the attached jobs that need it. A batch
  handed out stays held by the job until it sends Release.
- A job attaches at the next epoch boundary (`Plan.join_epoch`) and gets
  `Plan.epochs` epochs from there: epochs are counted per job.
- The join window: when a job attaches to a daemon with no job attached, a
  *group* begins, and no batch is handed out until at least `min_jobs` jobs
  are attached and no job has attached for `join_window` seconds. Batches are
  prepared meanwhile, and none is released, so every job of the group joins
  the same epoch (the first batch of it is still in the ring). `tick` closes
  the window and returns the batches for the jobs that waited.
- The producer prepares batches in order, only while some attached job that
  has begun an epoch needs the next one, and only into a free slot: so the fastest job is at most K
  batches ahead of the slowest (K = slots).
- A job that stops mid-epoch and begins the next one gives up the rest of the
  epoch (its holds on it are released at once).
- Resume (`resume`): a job restarted from a checkpoint moves, before its first
  epoch, to the batch its state names (global batch g = first batch of its
  epoch + batches it had received) and keeps its own first epoch, so with
  --epochs it gets exactly the epochs it had left. A batch is never lost to
  it: one still in the ring is held for it, one not prepared yet is
  prepared, and one that has already left the ring is *prepared again* (a
  batch is a pure function of (seed, epoch, items), so the copy is the same
  bytes). That is why a job holds only its *run*: the batches from its
  cursor on that are in the ring without a gap (`_run`). A job whose cursor
  batch is missing holds nothing ahead of it, so it can never fill the ring
  with batches it cannot reach yet (a deadlock: no free slot for the batch
  it waits for); the producer prepares the lowest batch some job needs and
  the ring lacks (`_next_needed`), so a job behind the others is caught up
  first, batch by batch, until its run meets theirs and they share each
  batch again. Meanwhile the others wait for it as for any slow job (the
  ring bounds how far ahead they run).
- A straggler is a holder of the oldest slot while the ring is full and the
  producer has work to do, that has made no progress (no request, no
  release) for `straggler_timeout` seconds; the daemon detaches it. Nobody
  is a straggler while the join window holds the batches back.
- A job whose iterator was dropped mid-epoch (a `break`, client.py) sends Pause
  (`pause`): it gives up the rest of the epoch as a Begin would, releases what
  it holds and needs nothing until its next Begin, so a dropped iterator never
  holds the ring while the job (or another loader in its process) goes on.
- With --epochs the daemon is done once a group has started and no job is
  attached any more (`finished`), unless a job left with epochs to go (a
  preempted job, to be resumed from its checkpoint): then it waits up to
  --linger seconds from that departure for a job to resume (Resume), and
  each resume settles one such departure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import protocol as p
from .plan import Plan
from .ring import SlotState, SlotTable


@dataclass
class Job:
    id: int
    pid: int
    start_epoch: int               # its first epoch (a daemon epoch number)
    cursor: int                    # next batch to hand out
    end: int | None                # first batch after its last epoch (None: no limit)
    last_progress: float           # monotonic time of its last request or release
    epoch: int | None = None       # the epoch it iterates (None: between epochs)
    epoch_end: int = 0             # first batch after that epoch
    wanted: int = 0                # batches asked for (Next's count) and not answered yet
    batches: int = 0               # batches handed out in all
    holding: set[int] = field(default_factory=set[int])  # batch indices handed out, not released
    resume_epoch: int | None = None  # resumed mid-epoch: the epoch its first Begin continues
    begun: bool = False            # it has sent Begin (too late to resume)
    paused: bool = False           # its iterator was dropped mid-epoch: it needs nothing until Begin

    def needs(self, index: int) -> bool:
        return (not self.paused and self.cursor <= index
                and (self.end is None or index < self.end))

    @property
    def waiting(self) -> bool:
        """A Next is pending until its batch is published."""
        return self.wanted > 0

    def unfinished(self) -> bool:
        """It has epochs to go (with --epochs): leaving now, it may come back to resume."""
        return self.end is not None and self.cursor < self.end


class Scheduler:
    def __init__(self, plan: Plan, slots: SlotTable, min_jobs: int = 1,
                 join_window: float = 0.0) -> None:
        self.plan, self.slots = plan, slots
        self.min_jobs, self.join_window = min_jobs, join_window
        self.jobs: dict[int, Job] = {}
        self.next_batch = 0          # the next batch to prepare
        self.gathering = False       # a group's join window is open: no batch is handed out
        self.last_attach = 0.0       # when the last job of the gathering group attached
        self.started = False         # some group's window has closed (batches were handed out)
        self.full_since: float | None = None  # when the producer last found no free slot
        self.owed = 0                # jobs that left with epochs to go and have not resumed since
        self.owed_since = 0.0        # when the last of them left
        self._next_id = 1

    # -- jobs --
    def join_epoch(self) -> int:
        """The epoch a job attaching now starts with: the first whose batches are all still to come."""
        low = self.next_batch
        while low - 1 in self.slots.by_index:  # the run of batches still in the ring
            low -= 1
        return self.plan.join_epoch(low)

    def attach(self, pid: int, now: float) -> Job:
        if not self.jobs:
            self.gathering = True    # the first job of a new group
        if self.gathering:
            self.last_attach = now
        start = self.join_epoch()
        cursor = self.plan.first_batch(start)
        job = Job(self._next_id, pid, start, cursor, self.plan.end_batch(start), now)
        self._next_id += 1
        self.jobs[job.id] = job
        self._extend(job)
        return job

    def resume(self, job_id: int, epoch: int, batches: int, start_epoch: int) -> p.Message:
        """Move a job that has not begun an epoch to batch `batches` of `epoch` (a daemon epoch
        number), its first epoch being `start_epoch`: the reply to Resume (see the module
        docstring: a batch that has left the ring is prepared again)."""
        job, bpe = self.jobs[job_id], self.plan.batches_per_epoch
        if job.begun:
            return p.Refused("resume after this job began an epoch: resume a fresh job (a new "
                             "DataLoader), before its first iter(loader)")
        if not (0 <= start_epoch <= epoch and 0 <= batches <= bpe):
            return p.Refused(f"resume at batch {batches} of epoch {epoch} with first epoch "
                             f"{start_epoch}: needs 0 <= first epoch <= epoch and 0 <= batch <= "
                             f"{bpe} (batches per epoch)")
        if batches == bpe:  # the epoch was received whole: the next one
            epoch, batches = epoch + 1, 0
        self._freed(self.slots.drop(job.id))  # what it held from where it attached
        end = self.plan.end_batch(start_epoch)
        if batches and end is not None and self.plan.first_batch(epoch) >= end:
            return self._had_its_epochs(start_epoch)
        self.owed = max(0, self.owed - 1)  # a job that left with epochs to go came back
        job.start_epoch, job.end = start_epoch, end
        job.cursor = self.plan.first_batch(epoch) + batches
        job.resume_epoch = epoch if batches else None
        self._extend(job)
        return p.Resumed(start_epoch, epoch, batches)

    def _run(self, job: Job):
        """The job's run: the batches from its cursor on that the ring holds (any state)
        without a gap, and that it needs; each as (index, slot)."""
        index = job.cursor
        while job.needs(index) and (slot := self.slots.by_index.get(index)) is not None:
            yield index, slot
            index += 1

    def _run_end(self, job: Job) -> int:
        """The first batch after the job's run (its cursor when the run is empty)."""
        index, in_ring = job.cursor, self.slots.by_index
        while index in in_ring and job.needs(index):
            index += 1
        return index

    def _extend(self, job: Job) -> None:
        """Hold every published batch of the job's run (one still filling is held at publish)."""
        for _index, slot in self._run(job):
            self.slots.hold(slot, job.id)

    def detach(self, job_id: int, now: float = 0.0) -> None:
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self._freed(self.slots.drop(job_id))
            if job.begun and job.unfinished():  # preempted: it may resume (`finished` waits)
                self.owed, self.owed_since = self.owed + 1, now
        if not self.jobs:
            self.gathering = False

    def tick(self, now: float) -> list[tuple[int, p.Message]]:
        """Close the join window once it has passed (the daemon calls this every turn of its
        loop; nothing else closes it): the replies for the jobs that waited."""
        if not (self.gathering and len(self.jobs) >= self.min_jobs
                and now - self.last_attach >= self.join_window):
            return []
        self.gathering, self.started = False, True
        self.full_since = None  # nobody could make progress while the window held the batches
        return [(job.id, reply) for job in self.jobs.values() for reply in self._answer(job)]

    def begin(self, job_id: int, now: float) -> p.Message:
        job = self.jobs[job_id]
        job.last_progress, job.wanted, job.begun, job.paused = now, 0, True, False
        bpe = self.plan.batches_per_epoch
        if job.epoch is None and job.resume_epoch is not None:  # resumed: the rest of that epoch
            epoch, job.resume_epoch = job.resume_epoch, None
            job.epoch, job.epoch_end = epoch, self.plan.first_batch(epoch + 1)
            return p.EpochStart(epoch, job.epoch_end - job.cursor)
        # between epochs: the one at the cursor; inside one: the next (the rest is given up)
        epoch = -(-job.cursor // bpe) if job.epoch is None else job.epoch + 1
        if job.end is not None and self.plan.first_batch(epoch) >= job.end:
            return self._had_its_epochs(job.start_epoch)
        for index in list(job.holding):  # handed out (a Next sent ahead) and now given up
            self.release(job.id, index, now)
        self._skip_to(job, self.plan.first_batch(epoch))
        self._extend(job)  # what it holds from its new cursor on
        job.epoch, job.epoch_end = epoch, job.cursor + bpe
        return p.EpochStart(epoch, bpe)

    def pause(self, job_id: int, now: float) -> None:
        """The job's iterator was dropped mid-epoch: it gives up the rest of the epoch (as a Begin
        would), lets go of every batch it holds and needs none until its next Begin."""
        job = self.jobs[job_id]
        job.last_progress, job.wanted = now, 0  # its cursor stays: the epoch is given up at
        job.holding.clear()                          # Begin, and a job that leaves now has epochs to go
        job.paused = True
        self._freed(self.slots.drop(job.id))

    def _had_its_epochs(self, start_epoch: int) -> p.Message:
        n = self.plan.epochs or 0  # called only when the plan has a limit
        last = start_epoch + n - 1
        return p.Refused(f"this job has had its {n} epochs (the daemon's epochs "
                         f"{start_epoch}-{last}; `coordl serve --epochs {n}` gives each job {n}): "
                         "iterate fewer epochs, or start the daemon with more (coordl serve --epochs)")

    def _skip_to(self, job: Job, cursor: int) -> None:
        """Move the cursor forward, releasing the batches the job gives up."""
        if cursor > job.cursor:
            freed: list[int] = []
            for index, slot in list(self.slots.by_index.items()):
                if job.cursor <= index < cursor and self.slots.release(slot, job.id):
                    freed.append(slot)
            job.cursor = cursor
            self._freed(freed)

    def next(self, job_id: int, now: float) -> p.Message | None:
        """The reply to Next (count 1), or None when the job must wait for the batch."""
        replies = self.ask(job_id, now, 1)
        return replies[0] if replies else None

    def ask(self, job_id: int, now: float, count: int) -> list[p.Message]:
        """The replies to Next(count) that can go now: the job's next batches that are ready, in
        order; the rest are answered as they are published (`published`, `failed`, `tick`)."""
        job = self.jobs[job_id]
        job.last_progress = now
        if job.epoch is None or job.paused:
            return [p.Refused("Next before Begin: start an epoch first")]
        job.wanted += count
        return self._answer(job)

    def _answer(self, job: Job) -> list[p.Message]:
        """What the job asked for and can have now: ready batches from its cursor on, and
        EndOfEpoch (which answers every ask left) once its epoch has no batch left. None while
        the join window holds the batches back; a batch not in the ring comes later, or is
        prepared again (a resumed job behind the ring: _next_needed)."""
        out: list[p.Message] = []
        while job.wanted and job.epoch is not None and not self.gathering:
            if job.cursor >= job.epoch_end:
                out.append(p.EndOfEpoch(job.epoch))
                job.epoch, job.wanted = None, 0
                break
            reply = self._deliver(job)
            if reply is None:
                break
            job.wanted -= 1
            out.append(reply)
        return out

    def _deliver(self, job: Job) -> p.Message | None:
        slot = self.slots.by_index.get(job.cursor)
        if slot is None or self.slots.state[slot] not in (SlotState.READY, SlotState.FAILED):
            return None
        index = job.cursor
        self.slots.hold(slot, job.id)  # in its run already; held so that nobody else frees it
        job.cursor += 1
        job.batches += 1
        if self.slots.state[slot] is SlotState.FAILED:
            error = self.slots.error[slot] or p.Failure("internal", "unknown error")
            self._freed([slot] if self.slots.release(slot, job.id) else [])
            return p.BatchFailed.of(index, error)
        job.holding.add(index)
        return p.Ready(index, self.plan.epoch_of(index), slot, self.slots.rows[slot])

    def release(self, job_id: int, index: int, now: float) -> None:
        job = self.jobs[job_id]
        job.last_progress = now
        if index not in job.holding:  # only what it was handed (others' holds are not its to drop)
            return
        job.holding.discard(index)
        slot = self.slots.by_index.get(index)
        if slot is not None and self.slots.release(slot, job_id):
            self._freed([slot])

    def _freed(self, slots: list[int]) -> None:
        if slots:
            self.full_since = None

    # -- production --
    def _next_needed(self) -> int | None:
        """The lowest batch an attached job needs that the ring lacks: the first after each
        job's run (for jobs in step that is `next_batch`; for a resumed job behind the ring, a
        batch that left it, prepared again). Only jobs that have begun an epoch count: one that
        has just attached may still move (Resume), and nothing is prepared for it in vain."""
        needed = [(self._run_end(j), j) for j in self.jobs.values() if j.begun]
        return min((g for g, j in needed if j.needs(g)), default=None)

    def to_prepare(self, now: float) -> tuple[int, int] | None:
        """(slot, batch) to prepare next, claimed; None when there is nothing to do now."""
        slot = self.slots.free_slot()
        if slot is None:  # the batch needed matters only to note when the ring became full
            if self.full_since is None and self._next_needed() is not None:
                self.full_since = now
            return None
        index = self._next_needed()
        if index is None:
            return None
        self.next_batch = max(self.next_batch, index + 1)
        self.slots.claim(slot, index, self.plan.epoch_of(index))
        self._extend_all()  # a batch prepared again may close a job's gap to ready ones
        return slot, index

    def _holders(self, index: int) -> set[int]:
        """The jobs whose run holds `index` (a job behind a gap gets it prepared again later)."""
        return {j.id for j in self.jobs.values() if j.cursor <= index < self._run_end(j)}

    def published(self, slot: int, rows: int) -> list[tuple[int, p.Message]]:
        self.slots.publish(slot, rows, self._holders(self.slots.index[slot]))
        self._extend_all()
        return self._wake(self.slots.index[slot])

    def failed(self, slot: int, error: p.Failure) -> list[tuple[int, p.Message]]:
        index = self.slots.index[slot]
        self.slots.fail(slot, error, self._holders(index))
        self._extend_all()
        return self._wake(index)

    def _extend_all(self) -> None:
        """A batch that closes a gap joins the runs of the jobs behind it to what follows."""
        for job in self.jobs.values():
            self._extend(job)

    def _wake(self, index: int) -> list[tuple[int, p.Message]]:
        return [(job.id, reply) for job in self.jobs.values() if job.wanted and job.cursor == index
                for reply in self._answer(job)]

    # -- faults and the end --
    def stragglers(self, now: float, timeout: float) -> list[int]:
        """Jobs to detach: they hold the oldest slot of a full ring and made no progress."""
        if self.gathering or self.full_since is None or self.slots.free_slot() is not None:
            return []
        oldest = self.slots.oldest()
        if oldest is None:
            return []
        holders = self.slots.holders[self.slots.by_index[oldest]]
        return [j for j in holders
                if now - max(self.jobs[j].last_progress, self.full_since) > timeout]

    def finished(self, now: float = 0.0, linger: float = 0.0) -> bool:
        """With --epochs: a group has started and every job has left, so the daemon is done; but
        while a job that left with epochs to go has not resumed, only `linger` seconds after the
        last such departure."""
        if self.plan.epochs is None or not self.started or self.jobs:
            return False
        return self.owed == 0 or now - self.owed_since >= linger

    def job_status(self, job: Job, now: float) -> dict[str, Any]:
        bpe = self.plan.batches_per_epoch
        epoch = job.epoch
        return {
            "job": job.id, "pid": job.pid, "start_epoch": job.start_epoch,
            "epoch": epoch,                                        # the daemon's epoch number
            "job_epoch": None if epoch is None else epoch - job.start_epoch,  # 0: its first epoch
            "epochs": self.plan.epochs,                            # each job's count (None: no limit)
            "batch": None if epoch is None else job.cursor - self.plan.first_batch(epoch),
            "batches_per_epoch": bpe, "holding": sorted(job.holding), "waiting": job.waiting,
            "batches": job.batches, "idle_s": round(now - job.last_progress, 3),
            "paused": job.paused,                                  # its iterator was dropped mid-epoch
        }
