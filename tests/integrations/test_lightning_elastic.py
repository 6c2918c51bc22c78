"""Elastic resume through a Lightning checkpoint (issue 28 point 2): a mid-epoch checkpoint of a
2-rank DDP run (CPU, gloo; coordl's own plan shards, use_distributed_sampler=False) resumed by
1 and by 3 ranks, and of a 1-rank run by 2 ranks, with coordl.ElasticResume (coordl/loader/
lightning.py). Lightning's checkpoint holds rank 0's loader state only; DDP ranks step together,
so it stands for every rank (coordl/loader/elastic.py): the new ranks read the rest of the epoch
once (padding aside), in exactly the batches they have left of it, then plain epochs."""

import hashlib
import json

import numpy as np
import pytest
import torch

import coordl
from coordl.epochs.sampling import epoch_order, rank_share
from coordl.errors import ConfigError
from coordl.loader.elastic import share_batches
from coordl.loader.lightning import epoch_left, rewrite_progress


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


# 30 items, batch_size 4; a checkpoint after 3 steps of epoch 0. Per rank: batches per epoch of the
# new world (len), batches of epoch 0 left after the checkpoint, so batch_idx runs len-left .. len-1:
#   2 -> 1: 24 read, 6 left: len 8, left 2 (shrinking: the loader ends first)
#   1 -> 2: 12 read, 18 left, 9 a rank: len 4, left 3 (without ElasticResume Lightning ran 4-3=1)
#   2 -> 3: 24 read, 6 left, 2 a rank: len 3, left 1
@pytest.mark.parametrize("world,new_world", [(2, 1), (1, 2), (2, 3)], ids=["2to1", "1to2", "2to3"])
def test_a_checkpoint_resumes_with_another_number_of_ranks(ids_root, tmp_path, job, saved_run, world, new_world):
    full = saved_run(world)  # tests/integrations/conftest.py: 2 epochs, a checkpoint every 3 steps
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    ranks = [_steps(full, r)["steps"] for r in range(world)]
    ckpt = full / "ckpt" / "step=3.ckpt"
    state = _loader_state(ckpt)
    assert (state["epoch"], state["batches"], state["identity"]["world_size"]) == (0, 3, world)
    read = [i for steps in ranks for e, b, ids, _h in steps if e == 0 and b < 3 for i in ids]
    assert len(read) == len(set(read)) == world * 3 * 4
    job(["lightning_job.py", ids_root, str(resumed), str(new_world), "0", "0", "2", "0", str(ckpt), "1"],
        nproc=new_world)
    rest = np.array([i for i in epoch_order(30, 7, 0).tolist() if i not in set(read)])
    length = share_batches(30, new_world, 4, False)
    left = share_batches(len(rest), new_world, 4, False)
    assert epoch_left(state, new_world) == (length, left)
    got = []
    for rank in range(new_world):
        record = _steps(resumed, rank)
        after = record["steps"]
        mine = [i for e, _b, ids, _h in after if e == 0 for i in ids]
        assert mine == rank_share(rest, rank, new_world).tolist()                 # its share of the rest
        assert [b for e, b, _ids, _h in after if e == 0] == list(range(length - left, length))
        assert [i for e, _b, ids, _h in after if e == 1 for i in ids] == \
            rank_share(epoch_order(30, 7, 1), rank, new_world).tolist()            # then plain epochs
        assert [b for e, b, _ids, _h in after if e == 1] == list(range(length))
        # Lightning's counters: every step taken counts once (3 before, left + length after)
        assert (record["global_step"], record["current_epoch"]) == (3 + left + length, 2)
        # byte for byte: the batches of a loader in this process resumed from the same state
        ds = coordl.ImageFolder(ids_root, transform="train", size=8, seed=7)
        here = coordl.DataLoader(ds, batch_size=4, shuffle=True, rank=rank, world_size=new_world)
        here.load_state_dict(state)
        assert [[ids, h] for _e, _b, ids, h in after] == _digests(here, 2)
        got += mine
    assert sorted(set(got)) == sorted(rest.tolist()) and len(got) - len(rest) == -len(rest) % new_world


def _checkpoint(full) -> dict:
    return torch.load(full / "ckpt" / "step=3.ckpt", weights_only=False, map_location="cpu")


def test_rewrite_progress_moves_only_this_epochs_batch_count(saved_run):
    saved = _checkpoint(saved_run(1))
    loops = saved["loops"]["fit_loop"]
    before = json.loads(json.dumps(saved["loops"], default=str))
    assert rewrite_progress(saved, 1) is None and saved["loops"]["fit_loop"] == loops  # the world that saved
    assert rewrite_progress(saved, 2) == 1                                            # 4 - 3 left
    progress = loops["epoch_loop.batch_progress"]
    assert progress["current"] == {"ready": 1, "completed": 0, "started": 1, "processed": 1}
    assert progress["total"] == before["fit_loop"]["epoch_loop.batch_progress"]["total"]
    assert not progress["is_last_batch"]
    for key in set(loops) - {"epoch_loop.batch_progress"}:                            # nothing else moves
        assert json.loads(json.dumps(loops[key], default=str)) == before["fit_loop"][key], key


def test_rewrite_progress_ends_an_epoch_the_new_world_has_nothing_left_of(ids_root, saved_run):
    """drop_last: 1 rank read 6 of its 7 batches (24 items); 2 ranks split the 6 left, 3 each, no
    whole batch of 4: the new ranks have nothing left of epoch 0, as after its last batch."""
    saved = _checkpoint(saved_run(1))
    loader = coordl.DataLoader(coordl.ImageFolder(ids_root, transform="train", size=8, seed=7), batch_size=4,
                               shuffle=True, drop_last=True)
    for n, _batch in enumerate(loader):
        if n == 5:
            break
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 6)
    saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] = [state]
    assert epoch_left(state, 2) == (3, 0)
    assert rewrite_progress(saved, 2) == 3
    progress = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert progress["current"] == {"ready": 3, "completed": 2, "started": 3, "processed": 3}
    assert progress["is_last_batch"]


def test_rewrite_progress_refuses_what_it_cannot_resume(saved_run):
    saved = _checkpoint(saved_run(1))
    with pytest.raises(ConfigError, match="limit_train_batches=0.5 cuts each epoch to 2 of the loader's 4"):
        rewrite_progress(saved, 2, 0.5)
    states = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    states.append(dict(states[0]))
    with pytest.raises(ConfigError, match="the states of 2 training loaders"):
        rewrite_progress(saved, 2)
