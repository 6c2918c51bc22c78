"""Elastic resume through a Lightning checkpoint (issue 28 point 2): a mid-epoch checkpoint of a
2-rank DDP run (CPU, gloo; coordl's own plan shards, use_distributed_sampler=False) resumed by a
1-rank run. Lightning's checkpoint holds rank 0's loader state only; DDP ranks step together, so
it stands for both ranks (coordl/loader/elastic.py): the 1-rank run reads the rest of the epoch
once, then plain 1-rank epochs."""

import hashlib
import json

import torch

import coordl
from coordl.loader.sampling import epoch_order


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


def test_a_two_rank_checkpoint_resumes_in_one_rank(ids_root, tmp_path, job):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir()
    resumed.mkdir()
    # 2 ranks, coordl's ranks, no workers, 2 epochs, a checkpoint every 3 steps (30 items: 4 batches a rank)
    job(["lightning_job.py", ids_root, str(full), "2", "0", "0", "2", "3"], timeout=400)
    ranks = [_steps(full, r)["steps"] for r in range(2)]
    ckpt = full / "ckpt" / "step=3.ckpt"
    state = _loader_state(ckpt)
    assert (state["epoch"], state["batches"], state["identity"]["world_size"]) == (0, 3, 2)
    read = [i for steps in ranks for e, b, ids, _h in steps if e == 0 and b < 3 for i in ids]
    assert len(read) == len(set(read)) == 2 * 3 * 4
    job(["lightning_job.py", ids_root, str(resumed), "1", "1", "0", "2", "0", str(ckpt)], timeout=400)
    after = _steps(resumed)["steps"]
    rest = [i for i in epoch_order(30, 7, 0).tolist() if i not in set(read)]
    assert [i for e, _b, ids, _h in after if e == 0 for i in ids] == rest          # the rest, once
    assert [i for e, _b, ids, _h in after if e == 1 for i in ids] == epoch_order(30, 7, 1).tolist()
    # byte for byte: the same batches as a loader in this process resumed from the same state
    ds = coordl.ImageFolder(ids_root, transform="train", size=8, seed=7)
    here = coordl.DataLoader(ds, batch_size=4, shuffle=True, rank=0, world_size=1)
    here.load_state_dict(state)
    assert [[ids, h] for _e, _b, ids, h in after] == _digests(here, 2)
