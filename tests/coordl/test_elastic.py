"""Elastic resume (issue 28 point 2): the states of a W-rank job load into a W'-rank job.

The dataset has one JPEG per class, so a sample's label is its item index: what every rank
read is known from the labels. Across the two jobs each item of the interrupted epoch is
read exactly once except the new job's DistributedSampler-style padding (the head of the
rest), each sample is byte-identical to the same item in an uninterrupted run, and the
epochs after are those of an uninterrupted W'-rank run.
"""

import hashlib
import json
import os
import sys
from collections import Counter

import numpy as np
import pytest

import coordl
from coordl.cli.make_dataset import make_dataset
from coordl.epochs.sampling import epoch_order, rank_share
from coordl.loader.elastic import merge_states, rest_of_epoch, resume_point

sys.path.insert(0, os.path.dirname(__file__))
from tests_resume_common import resume_in_fresh_process  # noqa: E402

ITEMS, BATCH, SEED = 37, 3, 5


@pytest.fixture(scope="module")
def ids_root(tmp_path_factory) -> str:
    """37 small JPEGs, one per class folder: a sample's label is its dataset index."""
    root = str(tmp_path_factory.mktemp("elastic-ids"))
    make_dataset(root, images=ITEMS, classes=ITEMS, size=(16, 12), quality=85, seed=3, workers=1, progress=False)
    return root


def _loader(root, rank, world, workers=0, drop_last=False):
    ds = coordl.ImageFolder(root, transform="train", size=8, seed=SEED)
    return coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, rank=rank, world_size=world,
                             num_workers=workers, drop_last=drop_last)


def _digest(x) -> str:
    return hashlib.sha256(x.contiguous().numpy().tobytes()).hexdigest()


def _samples(batches) -> list[tuple[int, str]]:
    """(item, sha256 of its image) of every sample of `batches`, in order."""
    return [(int(y), _digest(img)) for x, ys in batches for img, y in zip(x, ys)]


def _stop(root, world, cuts, epoch=1, drop_last=False):
    """Each rank r of a `world`-rank job reads cuts[r] batches of `epoch`; (samples read, states)."""
    read, states = [], []
    for rank, cut in enumerate(cuts):
        loader = _loader(root, rank, world, drop_last=drop_last)
        loader.set_epoch(epoch)
        it = iter(loader)
        read += _samples(next(it) for _ in range(cut))
        states.append(json.loads(json.dumps(loader.state_dict())))   # states go through JSON
        del it
    return read, states


def _reference(root, epoch, drop_last=False) -> dict[int, str]:
    """item -> sha256 of its image in an uninterrupted run of `epoch` (one rank reads all)."""
    loader = _loader(root, 0, 1, drop_last=False)
    loader.set_epoch(epoch)
    return dict(_samples(loader))


def _rest(order, read_items):
    read = set(read_items)
    return [i for i in order if i not in read]


@pytest.mark.parametrize("world,new_world,cuts", [
    (2, 3, [2, 5]),          # grow; ranks stopped at different batches
    (4, 2, [1, 3, 0, 4]),    # shrink; one rank read nothing
    (4, 1, [2, 2, 4, 3]),    # rank 2 read its whole share, padding included
    (3, 2, [4, 4, 4]),       # 3 -> 2, in step
    (1, 2, [7]),
])
def test_the_rest_of_the_epoch_is_read_once_by_the_new_ranks(ids_root, world, new_world, cuts):
    read, states = _stop(ids_root, world, cuts)
    order = epoch_order(ITEMS, SEED, 1).tolist()
    rest = _rest(order, [i for i, _ in read])
    assert len(rest) == ITEMS - len({i for i, _ in read})
    ref1, ref2 = _reference(ids_root, 1), _reference(ids_root, 2)
    assert all(ref1[i] == h for i, h in read)
    got = []
    for rank in range(new_world):
        loader = _loader(ids_root, rank, new_world)
        loader.load_state_dict(states)
        mine = _samples(loader)
        expect = rank_share(np.array(rest), rank, new_world).tolist()   # strided, padded by the head
        assert [i for i, _ in mine] == expect
        assert all(ref1[i] == h for i, h in mine)                       # byte-identical samples
        assert loader.state_dict()["epoch"] == 2
        after = _samples(loader)                                        # the epoch after: a plain W' run
        plain = _loader(ids_root, rank, new_world)
        plain.set_epoch(2)
        assert after == _samples(plain) and all(ref2[i] == h for i, h in after)
        got += [i for i, _ in mine]
    extra = Counter(got) - Counter(rest)
    assert sorted(Counter(rest) - Counter(got)) == []                   # the rest: every item read
    assert sum(extra.values()) == -len(rest) % new_world                # padding only ...
    assert set(extra) <= set(rest[:new_world - 1])                      # ... the head of the rest


def test_a_lone_state_stands_for_every_rank_at_its_batch(ids_root):
    """A Lightning checkpoint holds rank 0's state: with ranks in step, it is enough."""
    _read, states = _stop(ids_root, 2, [3, 3])
    merged = merge_states(states)
    lone, both = _loader(ids_root, 0, 1), _loader(ids_root, 0, 1)
    lone.load_state_dict(states[0])
    both.load_state_dict(merged)
    assert [y.tolist() for _, y in lone] == [y.tolist() for _, y in both]
    assert merged["consumed"] == [{"world_size": 2, "batches": [3, 3]}] and merged["batches"] == 0


def test_states_of_the_same_world_size_merge_exactly(ids_root):
    """The ranks' states loaded back into a job of the same size: each rank resumes the rest,
    not its own share (ranks at different batches would otherwise repeat or skip)."""
    read, states = _stop(ids_root, 2, [1, 4])
    rest = _rest(epoch_order(ITEMS, SEED, 1).tolist(), [i for i, _ in read])
    for rank in range(2):
        loader = _loader(ids_root, rank, 2)
        loader.load_state_dict(states)
        assert [i for i, _ in _samples(loader)] == rank_share(np.array(rest), rank, 2).tolist()


def test_a_resumed_job_stopped_again_resumes_again(ids_root):
    """2 ranks -> 3 (stopped again at different batches) -> 2: the stages chain."""
    read, states = _stop(ids_root, 2, [2, 3])
    order = epoch_order(ITEMS, SEED, 1).tolist()
    seen = [i for i, _ in read]
    second = []
    for rank, cut in enumerate([1, 2, 0]):
        loader = _loader(ids_root, rank, 3)
        loader.load_state_dict(states)
        it = iter(loader)
        seen += [int(y) for _ in range(cut) for y in next(it)[1]]
        second.append(json.loads(json.dumps(loader.state_dict())))
        del it
    assert second[1]["consumed"] == [{"world_size": 2, "batches": [2, 3]}] and second[1]["batches"] == 2
    assert Counter(seen) == Counter(set(seen))                           # no padding reached yet
    rest = _rest(order, seen)
    got = []
    for rank in range(2):
        loader = _loader(ids_root, rank, 2)
        loader.load_state_dict(second)
        mine = [int(y) for _, ys in loader for y in ys]
        assert mine == rank_share(np.array(rest), rank, 2).tolist()
        got += mine
    assert set(got) | set(seen) == set(order) and not set(got) & set(seen)


def test_a_rank_that_finished_the_epoch_merges_with_one_still_in_it(ids_root):
    """A rank's state after its last batch is at the next epoch, batch 0: it read its whole share."""
    read, states = _stop(ids_root, 2, [7, 5])          # 19 items per rank: 7 batches is all of rank 0's
    assert states[0]["epoch"] == 2 and states[0]["batches"] == 0
    merged = merge_states(states)
    assert merged["epoch"] == 1 and merged["consumed"] == [{"world_size": 2, "batches": [7, 5]}]
    rest = _rest(epoch_order(ITEMS, SEED, 1).tolist(), [i for i, _ in read])
    loader = _loader(ids_root, 0, 1)
    loader.load_state_dict(states)
    assert [int(y) for _, ys in loader for y in ys] == rest


def test_every_item_read_resumes_at_the_next_epoch(ids_root):
    _read, states = _stop(ids_root, 2, [7, 7])
    loader = _loader(ids_root, 1, 3)
    loader.load_state_dict(states)
    assert loader.state_dict()["epoch"] == 2
    plain = _loader(ids_root, 1, 3)
    plain.set_epoch(2)
    assert [y.tolist() for _, y in loader] == [y.tolist() for _, y in plain]


def test_drop_last_drops_as_any_run_drops(ids_root):
    """With drop_last each job cuts its split to full batches: the new ranks read only full batches
    of the rest, none of it twice and nothing read before."""
    read, states = _stop(ids_root, 3, [2, 1, 3], drop_last=True)
    rest = _rest(epoch_order(ITEMS, SEED, 1).tolist(), [i for i, _ in read])
    got = []
    for rank in range(2):
        loader = _loader(ids_root, rank, 2, drop_last=True)
        loader.load_state_dict(states)
        batches = [y.tolist() for _, y in loader]
        assert all(len(b) == BATCH for b in batches)
        got += [i for b in batches for i in b]
    assert len(got) == len(set(got)) and set(got) <= set(rest)
    assert len(rest) - len(got) < 2 * BATCH                              # what drop_last drops


def test_rest_of_epoch_is_positional():
    assert rest_of_epoch(10, [], 2, False).tolist() == list(range(10))
    # 2 ranks over 10 positions: rank 0 read 1 batch (0, 2), rank 1 two (1, 3, 5, 7)
    assert rest_of_epoch(10, [{"world_size": 2, "batches": [1, 2]}], 2, False).tolist() == [4, 6, 8, 9]
    # then 3 ranks split [4, 6, 8, 9] as [4, 9], [6, 4(pad)], [8, 6(pad)]: rank 2 read its one batch,
    # 6 as padding: read all the same
    stages = [{"world_size": 2, "batches": [1, 2]}, {"world_size": 3, "batches": [0, 0, 1]}]
    assert rest_of_epoch(10, stages, 2, False).tolist() == [4, 9]
    # 1 position left, 3 ranks: each reads it (two as padding)
    assert rest_of_epoch(3, [{"world_size": 1, "batches": [1]}, {"world_size": 3, "batches": [0, 1, 0]}],
                         2, False).tolist() == []


def _states():
    identity = {"dataset": "d", "items": ITEMS, "seed": SEED, "batch_size": BATCH, "drop_last": False,
                "shuffle": True, "world_size": 2}
    return [{"version": 2, "epoch": 1, "batches": b, "rank": r, "identity": dict(identity),
             "sampler": None, "consumed": []} for r, b in enumerate([2, 4])]


def _with(states, r, path, value):
    states = json.loads(json.dumps(states))
    target = states[r]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return states


@pytest.mark.parametrize("states,match", [
    (_states()[:1], r"1 states of a job of world_size 2: pass every rank's state"),
    (_states() * 2, r"4 states of a job of world_size 2"),
    ([], r"must be a non-empty list"),
    (_with(_states(), 1, ["identity", "seed"], 6), r"states\[1\]\['identity'\]\['seed'\]=6, states\[0\]'s is 5"),
    (_with(_states(), 1, ["rank"], 0), r"states\[1\]\['rank'\]=0"),
    (_with(_states(), 1, ["epoch"], 3), r"states\[1\] is at epoch 3, batch 4 .* states\[0\] at epoch 1"),
    (_with(_states(), 1, ["batches"], 8), r"states\[1\]\['batches'\]=8 \(int\) must be an int >= 0 and <= 7"),
    (_with(_states(), 0, ["batches"], True), r"states\[0\]\['batches'\]=True \(bool\)"),
    (_with(_states(), 0, ["version"], 9), r"states\[0\] version 9 is not known"),
    (_with(_states(), 0, ["sampler"], {"seed": 1}), r"states\[0\]\['sampler'\]"),
    (_with(_states(), 0, ["identity", "world_size"], "2"), r"states\[0\]\['identity'\]\['world_size'\]='2'"),
    (_with(_states(), 0, ["consumed"], {"x": 1}), r"states\[0\]\['consumed'\]=.* must be a list"),
    (_with(_with(_states(), 0, ["consumed"], [{"world_size": 2, "batches": [1]}]), 1, ["consumed"],
           [{"world_size": 2, "batches": [1]}]),
     r"states\[0\]\['consumed'\]\[0\]\['batches'\]=\[1\] must be a list of 2"),
    (_with(_states(), 0, ["consumed"], [{"world_size": 0, "batches": []}]),
     r"states\[0\]\['consumed'\]\[0\]\['world_size'\]=0"),
    (_with(_states(), 0, ["consumed"], [{"world_size": 1, "batches": [99]}]),
     r"states\[0\]\['consumed'\]\[0\]\['batches'\]\[0\]=99 .* <= 13"),
])
def test_merge_refuses_states_not_of_one_job_by_field(states, match):
    with pytest.raises(coordl.ConfigError, match=match):
        merge_states(states)


def test_a_loader_refuses_elastic_states_of_another_loader(ids_root):
    _read, states = _stop(ids_root, 2, [1, 2])
    other = coordl.DataLoader(coordl.ImageFolder(ids_root, transform="train", size=8, seed=SEED + 1),
                              batch_size=BATCH, shuffle=True, rank=0, world_size=3)
    with pytest.raises(coordl.ConfigError, match="seed: saved 5, this loader 6"):
        other.load_state_dict(states)
    loader = _loader(ids_root, 0, 3)
    with pytest.raises(coordl.ConfigError, match=r"batches=8 \(int\) must be an int >= 0 and <= 7 "
                                                 r"\(the batches per epoch of a rank of world_size 2\)"):
        loader.load_state_dict(dict(states[0], batches=8))
    with pytest.raises(coordl.ConfigError, match=r"consumed\[0\]\['batches'\]\[1\]='1'"):
        loader.load_state_dict(dict(states[0], version=2, consumed=[{"world_size": 2, "batches": [1, "1"]}]))
    with pytest.raises(coordl.ConfigError, match="a state of version 1 has no consumed stages"):
        loader.load_state_dict(dict(states[0], consumed=[{"world_size": 2, "batches": [1, 1]}]))
    with pytest.raises(coordl.ConfigError, match=r"identity\['world_size'\]=0"):
        loader.load_state_dict(dict(states[0], identity=dict(states[0]["identity"], world_size=0)))
    point = resume_point(merge_states(states), loader._identity())
    assert (point.epoch, point.skip, len(point.rest)) == (1, 0, ITEMS - 3 * BATCH)


def test_a_coordinated_loader_refuses_a_state_with_consumed_stages():
    from coordl.epochs import resume
    identity = {"dataset": "d", "items": 5, "seed": 0, "batch_size": 1, "drop_last": False, "shuffle": True,
                "world_size": 1}
    state = resume.make_state(identity, 0, 0, None, None, [{"world_size": 2, "batches": [1, 1]}])
    with pytest.raises(coordl.ConfigError, match="consumed=.*only a local coordl.DataLoader"):
        resume.check_state(state, identity)


@pytest.mark.slow  # two new interpreters with workers
def test_elastic_resume_in_fresh_processes_with_workers(ids_root, tmp_path):
    """A 3-rank job's states (ranks at different batches, 2 workers) resume in fresh 2-rank
    processes with 2 workers: the rest once, byte for byte, then a plain 2-rank epoch."""
    import torch

    def build(rank, world):  # as tests_resume_common.build builds it in the job
        ds = coordl.ImageFolder(ids_root, transform="train", size=24, seed=SEED)
        return coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, rank=rank, world_size=world)

    read, states = [], []
    for rank, cut in enumerate([1, 4, 2]):
        loader = build(rank, 3)
        loader.set_epoch(1)
        it = iter(loader)
        read += _samples(next(it) for _ in range(cut))
        states.append(json.loads(json.dumps(loader.state_dict())))
        del it, loader
    whole = build(0, 1)
    whole.set_epoch(1)
    ref1 = dict(_samples(whole))
    del whole
    rest = _rest(epoch_order(ITEMS, SEED, 1).tolist(), [i for i, _ in read])
    got = []
    for rank in range(2):
        config = {"root": ids_root, "batch_size": BATCH, "workers": 2, "seed": SEED, "rank": rank, "world_size": 2}
        run = resume_in_fresh_process(tmp_path, config, [states], f"rank{rank}")[0]
        mine = _samples(run["rest"])
        assert [i for i, _ in mine] == rank_share(np.array(rest), rank, 2).tolist()
        assert all(ref1[i] == h for i, h in mine)
        plain = build(rank, 2)
        plain.set_epoch(2)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                   for a, b in zip(run["after"], plain, strict=True))
        del plain
        got += [i for i, _ in mine]
    assert set(got) == set(rest) and len(got) == len(rest) + (len(rest) % 2)


def test_elastic_resume_through_a_minio_cache(ids_root, tmp_path):
    """3 ranks -> 2 with a node-wide MinIO cache: the same items, the same bytes as without."""
    import shutil

    from coordl.cache import shm

    root = str(tmp_path / "data")
    shutil.copytree(ids_root, root, copy_function=shutil.copy)   # fresh mtimes: a cache of this test
    try:
        def cached(rank, world):
            ds = coordl.ImageFolder(root, transform="train", size=8, seed=SEED)
            return coordl.DataLoader(ds, batch_size=BATCH, shuffle=True, rank=rank, world_size=world,
                                     cache=2**20)
        read, states = [], []
        for rank, cut in enumerate([2, 0, 3]):
            loader = cached(rank, 3)
            loader.set_epoch(1)
            it = iter(loader)
            read += _samples(next(it) for _ in range(cut))
            states.append(loader.state_dict())
            del it, loader
        ref1 = _reference(ids_root, 1)
        rest = _rest(epoch_order(ITEMS, SEED, 1).tolist(), [i for i, _ in read])
        hits = 0
        for rank in range(2):
            loader = cached(rank, 2)
            loader.load_state_dict(states)
            mine = _samples(loader)
            assert [i for i, _ in mine] == rank_share(np.array(rest), rank, 2).tolist()
            assert all(ref1[i] == h for i, h in mine + read)
            hits += loader.stats()["cache_hits"]
            del loader
        assert hits == 0        # the rest was never read before: nothing of it was cached
    finally:
        ds = coordl.ImageFolder(root, transform="train", size=8, seed=SEED)
        path = os.path.join(shm.SHM_DIR, shm.segment_name(ds.fingerprint))
        if os.path.exists(path):
            os.unlink(path)
