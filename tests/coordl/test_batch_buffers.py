"""Workers reuse a batch's shared-memory buffer only once the training process dropped it.

A reused buffer that is still in use would silently change a batch the user
holds: the tests compare what the user got (and kept) with a num_workers=0
run of the same seed, generator and epoch, where no buffer is shared, or,
for persistent workers (whose shuffle differs from torch's single-process
order from the second epoch on), with a run that holds every batch and so
cannot reuse any buffer.
"""

import gc
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import coordl
from coordl.buffers import EXTRA_SLOTS

WORKERS, BATCH = 2, 2  # 20 batches an epoch: more than the 2 x 5 slots
SLOTS = 2 + EXTRA_SLOTS  # prefetch_factor 2


def _loader(root, workers, **kw):
    ds = coordl.ImageFolder(root, transform="train", size=32, seed=3)
    return coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(9),
                             num_workers=workers, **kw)


def _reference(root, epochs):
    loader = _loader(root, 0)
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(epochs)]


def _same(got, want):
    assert len(got) == len(want)
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_batches_the_user_keeps_are_never_overwritten(tiny_root):
    want = _reference(tiny_root, 2)
    loader = _loader(tiny_root, WORKERS)
    kept = [list(loader) for _ in range(2)]  # every batch of 2 epochs held at once
    for got, ref in zip(kept, want):
        _same(got, ref)
    ptrs = {x.data_ptr() for epoch in kept for x, _ in epoch}
    assert len(ptrs) == 2 * len(loader)
    assert loader.stats()["batch_buffers"] == 2 * len(loader)  # nothing could be reused


def test_dropped_batches_give_their_buffers_back(tiny_root):
    want = _reference(tiny_root, 2)
    loader = _loader(tiny_root, WORKERS)
    for e in range(2):
        _same([(x.clone(), y.clone()) for x, y in loader], want[e])
    # each epoch starts new workers with new buffers; within one, 20 batches use <= 10 buffers
    assert loader.stats()["batch_buffers"] <= 2 * WORKERS * SLOTS < 2 * len(loader)


def test_persistent_workers_reuse_across_epochs(tiny_root):
    epochs = 4
    held = _loader(tiny_root, WORKERS, persistent_workers=True)
    want = [list(held) for _ in range(epochs)]  # held: no buffer can be reused, the truth
    assert held.stats()["batch_buffers"] == epochs * len(held)
    loader = _loader(tiny_root, WORKERS, persistent_workers=True)
    for e in range(epochs):
        _same([(x.clone(), y.clone()) for x, y in loader], want[e])
    assert loader.stats()["batch_buffers"] <= WORKERS * SLOTS


def test_a_view_the_user_keeps_holds_its_buffer(tiny_root):
    want = _reference(tiny_root, 2)
    loader = _loader(tiny_root, WORKERS)
    views = [[x[1] for x, _ in loader] for _ in range(2)]  # one image of each batch, a view
    for got, ref in zip(views, want):
        assert all(torch.equal(v, x[1]) for v, (x, _) in zip(got, ref))
    assert loader.stats()["batch_buffers"] == 2 * len(loader)


def test_an_epoch_left_unfinished_frees_its_in_flight_buffers(tiny_root):
    loader = _loader(tiny_root, WORKERS, persistent_workers=True)
    for _ in range(8):
        for _batch in loader:
            break  # the batches already prefetched are drained and dropped by torch
    assert loader.stats()["batch_buffers"] <= WORKERS * SLOTS


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")  # no accelerator here
def test_pin_memory_gives_the_same_batches(tiny_root):
    want = _reference(tiny_root, 2)
    loader = _loader(tiny_root, WORKERS, pin_memory=True)
    for e in range(2):
        _same([(x.clone(), y.clone()) for x, y in loader], want[e])


def test_a_custom_collate_gets_no_pool(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
    loader = coordl.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                               collate_fn=lambda b: torch.stack([x for x, _ in b]))
    assert sum(len(x) for x in loader) == len(ds)
    assert loader.dataset.batch_slots == 0 and ds.batch_slots == 0


@pytest.mark.parametrize("persistent", [False, True])
def test_a_torch_loader_rebuilt_from_the_dataset_reuses_buffers_too(tiny_root, persistent):
    # what Accelerate's prepare() does: a new loader of another class from loader.dataset, the
    # batch sampler (the plan's, which takes set_epoch) and the collate function; its iterator
    # is torch's own
    def plan_loader():
        ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=3)
        return coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                 persistent_workers=persistent)

    held = plan_loader()
    want = [list(held) for _ in range(2)]  # every batch held: nothing can be reused, the truth
    coordl_loader = plan_loader()
    rebuilt = torch.utils.data.DataLoader(coordl_loader.dataset, batch_sampler=coordl_loader.batch_sampler,
                                          collate_fn=coordl_loader.collate_fn, num_workers=WORKERS,
                                          persistent_workers=persistent)
    for e in range(2):
        rebuilt.batch_sampler.sampler.set_epoch(e)  # as Accelerate does at each iter()
        _same([(x.clone(), y.clone()) for x, y in rebuilt], want[e])
    assert coordl.loader_stats(rebuilt)["batch_buffers"] <= (1 if persistent else 2) * WORKERS * SLOTS


def test_reuse_buffers_false_allocates_every_batch(tiny_root):
    want = _reference(tiny_root, 1)
    loader = _loader(tiny_root, WORKERS, reuse_buffers=False)
    _same([(x.clone(), y.clone()) for x, y in loader], want[0])
    assert loader.stats()["batch_buffers"] == len(loader)


def test_a_batch_that_raises_gives_its_buffer_back(tmp_path, tiny_root):
    root = tmp_path / "bad"
    shutil.copytree(tiny_root, root)
    (root / "class_0001" / "text.jpg").write_text("not a JPEG\n")
    ds = coordl.ImageFolder(root, transform="train", size=32)  # on_error="raise"
    bad = next(i for i in range(len(ds)) if ds.manifest.path(i).endswith("text.jpg"))
    loader = coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True)
    errors = images = expected = 0
    it = None
    try:
        for epoch in range(4):
            # the order is the plan's (seed 0, epoch): the bad file's batch, which fails whole, is
            # known exactly (41 items in batches of 2: it may be the one-item last batch)
            pos = loader.sampler.indices(epoch).tolist().index(bad)
            expected += len(ds) - min(BATCH, len(ds) - pos // BATCH * BATCH)
            it = iter(loader)
            while True:
                try:
                    x, _y = next(it)
                except StopIteration:
                    break
                except coordl.SampleError as e:
                    assert "text.jpg" in str(e)
                    errors += 1
                    continue
                images += len(x)
        assert errors == 4 and images == expected
        assert loader.stats()["batch_buffers"] <= WORKERS * SLOTS
    finally:
        # torch's own iterator is kept in a reference cycle by a re-raised worker exception (plain
        # torch.utils.data.DataLoader does the same); the cycle collector ends its workers, also
        # when an assertion above failed
        del it, loader
        gc.collect()


def test_the_lender_drops_a_dead_workers_buffer_even_if_its_pid_was_reused():
    # A worker buffer made here (its trailer names this process), handed to a fresh Lender as a
    # batch arriving from a worker would be. The Lender records the pid's start time on first
    # sight: a pid now running with another start time (the kernel reused it) is not that worker.
    from coordl import buffers

    def arrive(lender):
        buf, reusable, _ = buffers.WorkerBuffers(slots=1).acquire(1024)
        assert reusable
        lender.arrived(torch.empty(0, dtype=torch.uint8).set_(buf, 0, (1024,)))
        return len(lender)

    alive = buffers.Lender()
    assert arrive(alive) == 1
    alive.sweep()
    assert len(alive) == 1  # this process is alive with the start time recorded: kept

    reused = buffers.Lender()
    assert arrive(reused) == 1
    (pid, start), = reused._pids.items()
    assert start is not None and pid == os.getpid()
    reused._pids[pid] = start - 1  # what a worker that died, and whose pid was reused, leaves
    reused.sweep()
    assert len(reused) == 0 and reused._pids == {}


_KEEPS_VIEWS_AT_EXIT = textwrap.dedent("""
    import sys
    import coordl

    ds = coordl.ImageFolder(sys.argv[1], transform="train", size=24)
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    kept = []
    for epoch in range(2):
        for x, y in loader:
            kept.append(x[:1])                  # views into the workers' batch buffers
    it = iter(loader)
    kept.append(next(it)[0])                    # an epoch left unfinished
    cycle = {"loader": loader, "it": it, "kept": kept}
    cycle["self"] = cycle                       # collected only at interpreter shutdown
    print("kept", len(kept))
""")


def test_exit_with_persistent_workers_and_kept_views_prints_no_ignored_exception(tiny_root, tmp_path):
    script = tmp_path / "keeps_views.py"
    script.write_text(_KEEPS_VIEWS_AT_EXIT)
    proc = subprocess.run([sys.executable, str(script), tiny_root], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "kept 21", proc.stderr[-2000:]
    assert "Exception ignored" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-2000:]
