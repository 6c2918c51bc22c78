"""coordl.DataLoader: drop-in for torch's, deterministic, counted, leak-free."""

import gc

import psutil
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

import coordl
from coordl.batch import collate
from coordl.loader.stats import Counters


def _whole_epoch(loader):
    xs, ys = [], []
    for x, y in loader:
        xs.append(x.clone())
        ys.append(y.clone())
    return torch.cat(xs), torch.cat(ys)


def test_is_a_torch_dataloader_and_batches_uint8(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert len(loader) == 5
    batches = list(loader)
    assert len(batches) == 5
    x, y = batches[0]
    assert x.dtype == torch.uint8 and tuple(x.shape) == (8, 3, 32, 32)
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert y.dtype == torch.int64 and tuple(y.shape) == (8,)


@pytest.mark.parametrize("transform", ["train", "val"])
def test_same_batches_whatever_num_workers_and_across_runs(tiny_root, transform):
    def run(workers, persistent=False):
        ds = coordl.ImageFolder(tiny_root, transform=transform, size=32, seed=11)
        g = torch.Generator().manual_seed(5)
        loader = coordl.DataLoader(ds, batch_size=6, shuffle=True, generator=g, num_workers=workers,
                                   persistent_workers=persistent)
        return [_whole_epoch(loader) for _ in range(2)]

    def same(a, b):
        return all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))

    a = run(0)
    assert same(a, run(2)) and same(a, run(0))
    # persistent workers draw the shuffle generator differently from epoch 2 on (torch's own
    # behaviour), so they are compared among themselves
    assert same(run(2, persistent=True), run(1, persistent=True))
    if transform == "train":  # a new epoch draws new augmentations
        assert not torch.equal(a[0][0], a[1][0])


def test_same_order_as_torch_dataloader_for_same_generator(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="val", size=32)
    ours = coordl.DataLoader(ds, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(3),
                             num_workers=2)
    order = torch.utils.data.DataLoader(range(len(ds)), batch_size=7, shuffle=True,
                                        generator=torch.Generator().manual_seed(3))
    for (x, y), idx in zip(ours, order):
        ref = torch.stack([ds[int(i)][0] for i in idx])
        assert torch.equal(x, ref)
        assert y.tolist() == [ds.targets[int(i)] for i in idx]


def test_set_epoch_resumes_the_same_augmentation(tiny_root):
    def loader():
        ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
        return coordl.DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)

    full = loader()
    epochs = [_whole_epoch(full) for _ in range(3)]
    resumed = loader()
    resumed.set_epoch(2)
    x, y = _whole_epoch(resumed)
    assert torch.equal(x, epochs[2][0]) and resumed.epoch == 2


def test_stats_count_every_read_and_decode_over_workers(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
    _whole_epoch(loader)
    s = loader.stats()
    total = ds.manifest.total_bytes
    assert s["storage_reads"] == 40 and s["storage_bytes"] == total
    assert s["decodes"] == 40 and s["samples"] == 40 and s["errors_skipped"] == 0
    _whole_epoch(loader)
    s2 = loader.stats()
    assert s2["storage_reads"] == 80 and s2["storage_bytes"] == 2 * total  # cumulative


def test_counters_refuse_a_worker_they_have_no_row_for(tiny_root):
    # a loader over a coordl.DataLoader's dataset with more workers than its counters have rows
    # for is refused with the fix (before: the extra workers counted into the last row)
    ds = coordl.ImageFolder(tiny_root, transform="val", size=32)
    loader = coordl.DataLoader(ds, batch_size=8, num_workers=1)
    with pytest.raises(coordl.ConfigError, match=r"num_workers=3: .* rows for 1 workers; pass num_workers<=1"):
        coordl.DataLoader(loader.dataset, batch_size=8, num_workers=3)
    assert len(list(coordl.DataLoader(loader.dataset, batch_size=8, num_workers=1))) == 5
    wider = iter(torch.utils.data.DataLoader(loader.dataset, batch_size=8, num_workers=2, collate_fn=collate))
    with pytest.raises(coordl.ConfigError, match=r"worker 1 of 2 has no row in these loader counters, made "
                       r"for num_workers=1: .* Pass num_workers<=1"):
        for _ in wider:
            pass
    wider._shutdown_workers()  # torch's own iterator, held by the exception's traceback: stop its
    del wider                  # workers now (left to the collector, torch waits 5 s for each)
    for bad in (-1, True, 1.5):
        with pytest.raises(coordl.ConfigError, match=f"num_workers={bad!r} must be an int >= 0"):
            Counters(bad)


def test_drop_in_on_tensor_dataset_with_every_argument():
    data = TensorDataset(torch.arange(100).float().view(50, 2), torch.arange(50))
    inits = torch.zeros(2, 2, dtype=torch.int64).share_memory_()  # [loader, worker], seen across processes

    def init_for(row):
        def init(worker_id):
            inits[row, worker_id] += 1
        return init

    def collate(batch):
        return torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])

    kwargs = dict(batch_size=7, shuffle=True, num_workers=2, collate_fn=collate, drop_last=True,
                  timeout=30, prefetch_factor=3, persistent_workers=True,
                  pin_memory=False, multiprocessing_context="fork")
    ours = coordl.DataLoader(data, generator=torch.Generator().manual_seed(1), worker_init_fn=init_for(0), **kwargs)
    ref = torch.utils.data.DataLoader(data, generator=torch.Generator().manual_seed(1),
                                      worker_init_fn=init_for(1), **kwargs)
    for _ in range(2):
        a, b = list(ours), list(ref)
        assert len(a) == len(b) == 7
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert inits.tolist() == [[1, 1], [1, 1]]  # each persistent worker initialised once, in both
    del ours, ref
    sampler = torch.utils.data.SequentialSampler(data)
    bs = torch.utils.data.BatchSampler(sampler, 10, False)
    assert [y.tolist() for _, y in coordl.DataLoader(data, batch_sampler=bs)] == \
        [y.tolist() for _, y in torch.utils.data.DataLoader(data, batch_sampler=bs)]
    assert [int(y) for _, y in coordl.DataLoader(data, batch_size=None, sampler=sampler)] == list(range(50))


class _Counting(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, n = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(wid, 30, n))


def test_drop_in_on_iterable_dataset():
    for workers in (0, 2):
        ours = sorted(int(v) for b in coordl.DataLoader(_Counting(), batch_size=4, num_workers=workers) for v in b)
        ref = sorted(int(v) for b in torch.utils.data.DataLoader(_Counting(), batch_size=4,
                                                                 num_workers=workers) for v in b)
        assert ours == ref == list(range(30))


def test_no_worker_survives_the_loader(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    me = psutil.Process()
    assert len(me.children()) >= 2
    del it, loader
    gc.collect()
    psutil.wait_procs(me.children(), timeout=10)
    # Python's own helpers (resource_tracker, forkserver: started once by an earlier test's spawn
    # workers, live until exit) are no loader's workers
    helpers = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
    assert [p for p in me.children() if p.status() != psutil.STATUS_ZOMBIE
            and not any(h in " ".join(p.cmdline()) for h in helpers)] == []


def test_spawn_workers_give_the_same_batches_and_counts(tiny_root):
    def run(ctx):
        ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=2)
        loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, multiprocessing_context=ctx,
                                   generator=torch.Generator().manual_seed(0))
        return _whole_epoch(loader), loader.stats()

    (xa, ya), sa = run("fork")
    (xb, yb), sb = run("spawn")
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert sa["decodes"] == sb["decodes"] == 40
