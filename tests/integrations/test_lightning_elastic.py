"""Elastic resume through a Lightning checkpoint (issue 28 point 2): a mid-epoch checkpoint of a
2-rank DDP run (CPU, gloo; coordl's own plan shards, use_distributed_sampler=False) resumed by a
1-rank run, and of a 1-rank run by a 2-rank run. Lightning's checkpoint holds rank 0's loader
state only; DDP ranks step together, so it stands for every rank (coordl/loader/elastic.py): the
new ranks read the rest of the epoch once (padding aside), then plain epochs."""

import hashlib
import json

import numpy as np
import pytest
import torch

import coordl
from coordl.loader.sampling import epoch_order, rank_share


def _steps(out, rank=0):
    return json.loads((out / f"steps-rank{rank}.json").read_text())


def _loader_state(ckpt) -> dict:
    saved = torch.load(ckpt, weights_only=False, map_location="cpu")
    states = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(states) == 1
    return states[0]


def _digests(loader, epochs):
    out = []
    for _ in range(epochs):
        for images, labels in loader:
            out.append([labels.tolist(), hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest()])
    return out


LIGHTNING_GROWS_SHORT = pytest.mark.xfail(strict=True, reason=(
    "Lightning reads len(loader) (a whole epoch of the new, larger world) before it loads the "
    "loader's state, and restores its own count of the epoch's batches (3): it ends the resumed "
    "epoch after len - 3 batches, before the new ranks have read the rest. Not fixable from the "
    "loader; shrinking is fine (len of the smaller world is larger)"))


@pytest.mark.parametrize("world,new_world", [(2, 1), pytest.param(1, 2, marks=LIGHTNING_GROWS_SHORT)],
                         ids=["2to1", "1to2"])
def test_a_checkpoint_resumes_with_another_number_of_ranks(ids_root, tmp_path, job, world, new_world):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir()
    resumed.mkdir()
    # coordl's ranks (use_distributed_sampler=False), no workers, 2 epochs, a checkpoint every 3 steps
    job(["lightning_job.py", ids_root, str(full), str(world), "0", "0", "2", "3"], nproc=world, timeout=400)
    ranks = [_steps(full, r)["steps"] for r in range(world)]
    ckpt = full / "ckpt" / "step=3.ckpt"
    state = _loader_state(ckpt)
    assert (state["epoch"], state["batches"], state["identity"]["world_size"]) == (0, 3, world)
    read = [i for steps in ranks for e, b, ids, _h in steps if e == 0 and b < 3 for i in ids]
    assert len(read) == len(set(read)) == world * 3 * 4
    job(["lightning_job.py", ids_root, str(resumed), str(new_world), "0", "0", "2", "0", str(ckpt)],
        nproc=new_world, timeout=400)
    rest = np.array([i for i in epoch_order(30, 7, 0).tolist() if i not in set(read)])
    got = []
    for rank in range(new_world):
        after = _steps(resumed, rank)["steps"]
        mine = [i for e, _b, ids, _h in after if e == 0 for i in ids]
        assert mine == rank_share(rest, rank, new_world).tolist()                 # its share of the rest
        assert [i for e, _b, ids, _h in after if e == 1 for i in ids] == \
            rank_share(epoch_order(30, 7, 1), rank, new_world).tolist()            # then plain epochs
        # byte for byte: the batches of a loader in this process resumed from the same state
        ds = coordl.ImageFolder(ids_root, transform="train", size=8, seed=7)
        here = coordl.DataLoader(ds, batch_size=4, shuffle=True, rank=rank, world_size=new_world)
        here.load_state_dict(state)
        assert [[ids, h] for _e, _b, ids, h in after] == _digests(here, 2)
        got += mine
    assert sorted(set(got)) == sorted(rest.tolist()) and len(got) - len(rest) == -len(rest) % new_world
