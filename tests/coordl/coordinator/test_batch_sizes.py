"""Jobs of their own batch size and drop_last at one daemon (assemble.py): each gets the batches
of a local coordl.DataLoader with its batch size over the same plan, byte for byte, while the
daemon prepares every item once per epoch for all of them."""

from __future__ import annotations

import hashlib
import signal
import time

import pytest
import torch

import coordl
from coordl.coordinator.assemble import Cut

N = 40  # tiny_root's images
JOB_SIZES = [(3, False), (6, True), (16, False)]  # (batch_size, drop_last): 3 below, 16 above the 4-chunk


def _digest(images, labels) -> str:
    h = hashlib.sha256()
    for t in (images.contiguous(), labels):
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _local(root, batch_size, drop_last, epoch) -> list[str]:
    """Digests of a local loader's batches of `epoch` (job_main.py's digest)."""
    ds = coordl.ImageFolder(root, transform="train", size=32, seed=0)
    loader = coordl.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=drop_last)
    loader.set_epoch(epoch)
    return [_digest(x, y) for x, y in loader]


def _matches_local(root, result, batch_size, drop_last, epochs) -> None:
    assert result["error"] is None, result["error"]
    assert result["batches_per_epoch"] == Cut(N, 4, batch_size, drop_last).batches_per_epoch
    assert len(result["epochs"]) == epochs
    for record in result["epochs"]:
        assert record["digests"] == _local(root, batch_size, drop_last, record["epoch"]), (batch_size, drop_last)


def test_cut_positions_and_resume_points():
    cut = Cut(40, 4, 6, drop_last=True)
    assert cut.batches_per_epoch == 6 and cut.span(5) == (30, 36)
    assert cut.start(3) == (4, 2)  # after 18 samples: chunk 4, its first 2 rows had
    assert cut.start(6) == (10, 0)  # the epoch had whole
    keep = Cut(40, 4, 16, drop_last=False)
    assert keep.batches_per_epoch == 3 and keep.span(2) == (32, 40) and keep.chunk_span(9) == (36, 40)


def test_mixed_batch_sizes_get_the_local_batches_and_each_item_is_decoded_once_per_epoch(tiny_root, serve, jobs):
    served = serve(tiny_root, epochs=2, min_jobs=3, slots=3)  # 3 chunks of 4: less than one batch of 16
    running = [jobs(tiny_root, served, batch_size=b, drop_last=d) for b, d in JOB_SIZES]
    results = [job.result() for job in running]
    for (b, d), result in zip(JOB_SIZES, results):
        _matches_local(tiny_root, result, b, d, epochs=2)
        assert [e["epoch"] for e in result["epochs"]] == [0, 1]
    assert max(r["status"]["decodes"] for r in results) == 2 * N  # once per item and epoch, for all three
    assert served.wait() == 0  # each had its 2 epochs (drop_last's tails released): no linger
    assert served.segments_left() == []


def test_a_killed_job_and_a_late_job_of_other_batch_sizes(tiny_root, serve, jobs):
    served = serve(tiny_root, min_jobs=2, slots=3)
    steady = jobs(tiny_root, served, batch_size=6, drop_last=True, epochs=3, sleep=0.02)
    doomed = jobs(tiny_root, served, batch_size=16, epochs=3)
    doomed.wait_for("batch 0 1")
    doomed.proc.kill()
    assert doomed.proc.wait() == -signal.SIGKILL
    steady.wait_for("batch 0 2")
    late = jobs(tiny_root, served, batch_size=3, epochs=1)  # attaches mid-epoch: starts at the next
    _matches_local(tiny_root, steady.result(), 6, True, epochs=3)
    result = late.result()
    _matches_local(tiny_root, result, 3, False, epochs=1)
    assert result["start_epoch"] >= 1


def test_resume_at_a_batch_boundary_inside_a_chunk(tiny_root, serve):
    served = serve(tiny_root)
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=0)

    def loader():
        return coordl.DataLoader(ds, batch_size=6, shuffle=True, drop_last=True, timeout=60,
                                 coordinator=served.address)

    first = loader()
    it = iter(first)
    had = [_digest(*next(it)) for _ in range(3)]  # 18 samples: inside chunk 4 (16-19)
    state = first.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 3)
    del it
    first.coordinator.close()
    again = loader()  # a new job (as a new process would be), alone at the daemon
    again.load_state_dict(state)
    rest = [_digest(x, y) for x, y in again]
    assert again.epoch == 0 and had + rest == _local(tiny_root, 6, True, 0)
    assert again.state_dict()["epoch"] == 1  # the epoch had whole
    again.coordinator.close()


def test_a_drop_last_daemon_refuses_another_batch_size_naming_keep_last(tiny_root, serve):
    served = serve(tiny_root, drop_last=True)
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=0)
    with pytest.raises(coordl.CoordinatorError, match="--keep-last .* serves jobs of every batch size"):
        coordl.DataLoader(ds, batch_size=6, shuffle=True, drop_last=True, coordinator=served.address)
    same = coordl.DataLoader(ds, batch_size=4, shuffle=True, drop_last=True, coordinator=served.address)
    assert len(same) == 10
    same.coordinator.close()


def test_messages_per_batch_not_per_chunk(tiny_root, serve):
    """A job of batch 16 over chunks of 4 asks for a batch's 4 chunks with one Next, a batch ahead,
    with the Releases of the chunks it used up (one Release per run of chunks): about two messages
    per batch, and one write of replies per batch, where one per chunk each way was sent before."""
    served = serve(tiny_root, slots=10)  # the whole epoch (10 chunks) fits the ring
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=0)
    loader = coordl.DataLoader(ds, batch_size=16, shuffle=True, timeout=60, coordinator=served.address)
    it = iter(loader)  # Begin: the daemon prepares the epoch
    deadline = time.monotonic() + 60
    while served.status()["produced_batches"] < 10:  # every chunk ready before the first Next
        assert time.monotonic() < deadline, "the daemon did not prepare the epoch"
        time.sleep(0.01)
    digests = [_digest(x, y) for x, y in it]
    assert digests == _local(tiny_root, 16, False, 0)
    (job,) = served.status()["jobs"]
    batches, chunks = len(digests), 10
    assert batches == 3
    # hello, begin, then per batch: Next + Release; the end: Next (for EndOfEpoch) + the last Release
    assert job["messages"] <= 2 + 2 * batches + 2 < 2 * chunks
    assert job["writes"] <= 2 + batches + 1  # welcome, epoch start, one per batch, the end of the epoch
    loader.coordinator.close()


def test_copied_batches_reuse_their_memory(tiny_root, serve):
    """A job of its own batch size copies each batch once into memory of its own, made again only
    while the user keeps the batch: a loop that lets go of each batch uses two buffers."""
    served = serve(tiny_root, slots=3)
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=0)
    loader = coordl.DataLoader(ds, batch_size=6, shuffle=True, drop_last=True, timeout=60,
                               coordinator=served.address)
    pointers, kept = set(), []
    for epoch in range(2):
        digests = []
        for x, y in loader:
            pointers.add(x.untyped_storage().data_ptr())
            digests.append(_digest(x, y))
        assert digests == _local(tiny_root, 6, True, epoch)  # no batch overwritten while in hand
    assert len(pointers) == 2 and loader.coordinator.out.misses == 0
    for x, _ in loader:  # a user who keeps every batch: each keeps its memory
        kept.append(x)
    assert len({x.untyped_storage().data_ptr() for x in kept}) == len(kept) == 6
    assert [_digest(x, torch.zeros(0, dtype=torch.int64)) for x in kept] == \
        [_digest(x, torch.zeros(0, dtype=torch.int64)) for x, _ in _local_batches(tiny_root, 6, True, 2)]
    loader.coordinator.close()


def _local_batches(root, batch_size, drop_last, epoch):
    ds = coordl.ImageFolder(root, transform="train", size=32, seed=0)
    loader = coordl.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=drop_last)
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_big_batch_buffer_is_asked_for_in_huge_pages():
    """A job's batch buffers of 2 MiB or more are anonymous memory advised MADV_HUGEPAGE (its
    first fill then takes a few dozen page faults, not one per 4 KiB), reused like any other:
    the use count says when the user has let go, and the memory outlives the buffers list
    while a batch on it is alive."""
    from coordl.buffers import HUGE_PAGE, new_private
    from coordl.coordinator.assemble import OutputBuffers

    out = OutputBuffers(slots=2)
    shape = (64, 224, 224, 3)  # 9.6 MB
    a = out.take(shape, torch.uint8)
    assert "hg" in _vm_flags(a.data_ptr())
    a.fill_(7)
    ptr = a.data_ptr()
    b = out.take(shape, torch.uint8)  # `a` is alive: another buffer
    assert b.data_ptr() != ptr and "hg" in _vm_flags(b.data_ptr())
    del a
    c = out.take(shape, torch.uint8)  # `a` let go: its memory again, contents as left
    assert c.data_ptr() == ptr and int(c[0, 0, 0, 0]) == 7 and out.misses == 0
    out._buffers[False].clear()  # the pool forgets it; `c` still holds the mapping
    c.fill_(3)
    assert int(c.sum()) == 3 * c.numel()
    small = new_private(HUGE_PAGE - 1)  # under 2 MiB: torch's own memory
    assert "hg" not in _vm_flags(small.data_ptr())
