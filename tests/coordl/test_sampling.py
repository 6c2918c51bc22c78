"""coordl/epochs/sampling.py and DataLoader(rank=, world_size=): one plan, DistributedSampler's shares."""

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

import coordl
from coordl.coordinator.plan import Plan
from coordl.epochs.sampling import PlanSampler, epoch_order, rank_share, share_size


@pytest.mark.parametrize("items", [1, 7, 40, 41])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shares_are_disjoint_covering_and_sized_as_distributed_sampler(items, world_size, drop_last):
    if drop_last and items < world_size:
        return
    data = list(range(items))
    for epoch in range(3):
        order = epoch_order(items, seed=4, epoch=epoch)
        shares = [rank_share(order, r, world_size, drop_last).tolist() for r in range(world_size)]
        ref = [DistributedSampler(data, world_size, r, shuffle=False, drop_last=drop_last) for r in range(world_size)]
        size = share_size(items, world_size, drop_last)
        assert [len(s) for s in shares] == [len(r) for r in ref] == [size] * world_size
        flat = [i for s in shares for i in s]
        if drop_last:
            assert len(set(flat)) == len(flat)                        # disjoint: nothing twice
        else:
            assert set(flat) == set(range(items))                     # covering
            assert len(flat) - len(set(flat)) == len(flat) - items    # only the padding repeats
        # the same split DistributedSampler makes of its own order, applied to ours
        padded = order.tolist() * (1 + len(flat) // max(items, 1))
        assert shares == [padded[:len(flat)][r::world_size] for r in range(world_size)]


def test_epoch_order_is_a_pure_permutation_of_seed_and_epoch():
    a, b = epoch_order(50, 1, 0), epoch_order(50, 1, 0)
    assert a.tolist() == b.tolist() and sorted(a.tolist()) == list(range(50))
    assert a.tolist() != epoch_order(50, 1, 1).tolist() != epoch_order(50, 2, 0).tolist()
    assert epoch_order(50, 1, 0, shuffle=False).tolist() == list(range(50))
    assert not a.flags.writeable
    assert Plan(50, 8, seed=1).order(0).tolist() == a.tolist()        # the daemon's plan is the same


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_loader_ranks_of_a_coordl_dataset(tiny_root, world_size):
    ds = coordl.ImageFolder(tiny_root, transform="val", size=16, seed=6)   # 40 items, 3 does not divide
    seen = []
    for rank in range(world_size):
        loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, rank=rank, world_size=world_size)
        assert (loader.rank, loader.world_size) == (rank, world_size)
        per_epoch = []
        for epoch in range(2):
            ids = []
            for _x, y in loader:
                ids.extend(y.tolist())
            per_epoch.append(loader.epoch_indices(epoch))
            assert len(ids) == len(per_epoch[-1])
        assert len(loader) == -(-share_size(40, world_size) // 4)
        seen.append(per_epoch)
    for epoch in range(2):
        flat = [i for r in range(world_size) for i in seen[r][epoch]]
        assert set(flat) == set(range(40))
        order = epoch_order(40, 6, epoch)
        assert seen[0][epoch] == rank_share(order, 0, world_size).tolist()
    assert seen[0][0] != seen[0][1]                                  # a new order every epoch


def test_loader_order_is_the_plan_order_and_labels_follow(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="val", size=16, seed=2)
    loader = coordl.DataLoader(ds, batch_size=5, shuffle=True, num_workers=2)
    for epoch in range(2):
        labels = torch.cat([y for _x, y in loader]).tolist()
        assert labels == [int(ds.manifest.labels[i]) for i in epoch_order(len(ds), 2, epoch)]
    assert isinstance(loader.sampler, PlanSampler) and isinstance(loader.sampler, torch.utils.data.RandomSampler)
    unshuffled = coordl.DataLoader(ds, batch_size=5)
    assert torch.cat([y for _x, y in unshuffled]).tolist() == ds.manifest.labels.tolist()


@pytest.mark.parametrize("world_size", [2, 3])
def test_loader_ranks_of_any_dataset_match_distributed_sampler(world_size):
    data = TensorDataset(torch.arange(41))
    for rank in range(world_size):
        ours = coordl.DataLoader(data, batch_size=4, shuffle=True, rank=rank, world_size=world_size)
        ref_sampler = DistributedSampler(data, world_size, rank, shuffle=True, seed=0)
        ref = torch.utils.data.DataLoader(data, batch_size=4, sampler=ref_sampler)
        for epoch in range(2):
            ref_sampler.set_epoch(epoch)
            assert [b[0].tolist() for b in ours] == [b[0].tolist() for b in ref]
        assert len(ours) == len(ref)


def test_a_users_distributed_sampler_is_left_alone(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="val", size=16)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = coordl.DataLoader(ds, batch_size=4, sampler=sampler)
    assert loader.sampler is sampler and len(loader) == 5
    sampler.set_epoch(1)
    assert torch.cat([y for _x, y in loader]).tolist() == [int(ds.manifest.labels[i]) for i in sampler]
    with pytest.raises(coordl.ConfigError, match="both shard"):
        coordl.DataLoader(ds, batch_size=4, sampler=sampler, rank=1, world_size=2)


@pytest.mark.parametrize("kw,match", [({"rank": 3, "world_size": 3}, "rank=3"),
                                      ({"rank": 0, "world_size": 0}, "world_size=0"),
                                      ({"rank": -1, "world_size": 2}, "rank=-1")])
def test_bad_ranks_are_refused(tiny_root, kw, match):
    with pytest.raises(coordl.ConfigError, match=match):
        coordl.DataLoader(coordl.ImageFolder(tiny_root, transform="val", size=16), **kw)
