"""Exact mid-epoch resume: the rest of an interrupted epoch, in a fresh process, byte for byte."""

import json
import os
import shutil
import sys

import pytest
import torch

import coordl
from coordl.cache import shm

sys.path.insert(0, os.path.dirname(__file__))
from coordl_tests_loaderhelp import batches_of
from tests_resume_common import build, resume_in_fresh_process  # noqa: E402


@pytest.fixture
def own_root(tiny_root, tmp_path):
    """A copy of tiny_root with fresh mtimes: a dataset (fingerprint, cache) of this test alone."""
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    yield root
    ds = coordl.ImageFolder(root, transform="train", size=24)
    path = os.path.join(shm.SHM_DIR, shm.segment_name(ds.fingerprint))
    if os.path.exists(path):
        os.unlink(path)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


CONFIGS = [
    {"workers": 0},
    {"workers": 2},
    {"workers": 2, "persistent": True},
    {"workers": 0, "cache": 2**20},
    {"workers": 2, "cache": 2**20, "persistent": True},
    {"workers": 2, "rank": 1, "world_size": 3},
    {"workers": 0, "rank": 1, "world_size": 3, "cache": 2**20},
]


@pytest.mark.slow  # a new interpreter (import torch) per config
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_interrupted_epoch_resumes_exactly_in_a_fresh_process(own_root, tmp_path, config):
    config = dict(config, root=own_root, batch_size=3, seed=5)
    reference = build(config)
    epochs = [batches_of(reference) for _ in range(3)]      # epochs 0, 1, 2 uninterrupted
    n = len(epochs[1])
    assert n == len(reference) and n >= 4
    del reference
    states, cuts = [], [1, n // 2, n - 1]                 # interrupt at the first, middle and last batch
    for cut in cuts:
        loader = build(config)
        batches_of(loader)                                  # epoch 0 whole
        it = iter(loader)
        got = [next(it) for _ in range(cut)]              # workers prefetch beyond this: not counted
        assert _same([(x.clone(), y.clone()) for x, y in got], epochs[1][:cut])
        state = loader.state_dict()
        assert state["epoch"] == 1 and state["batches"] == cut
        states.append(json.loads(json.dumps(state)))
        del it, got, loader
    runs = resume_in_fresh_process(tmp_path, config, states)
    for cut, run in zip(cuts, runs):
        assert _same(run["rest"], epochs[1][cut:]), f"rest of epoch 1 after {cut} batches"
        assert _same(run["after"], epochs[2]), "the epoch after the resumed one"


@pytest.mark.parametrize("config", [{"tensor": True, "batch_size": 4},
                                    {"tensor": True, "batch_size": 4, "generator": 7, "workers": 2}])
def test_any_map_dataset_resumes_by_position_with_torchs_shuffle(tmp_path, config):
    torch.manual_seed(123)
    loader = build(config)
    first = batches_of(loader)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest_here = _batches_from(it)
    run = resume_in_fresh_process(tmp_path, config, [state])[0]
    assert _same(run["rest"], rest_here) and len(got) + len(rest_here) == len(first)


def _batches_from(it):
    return [(x.clone(), y.clone()) for x, y in it]


def test_a_finished_epoch_resumes_at_the_next(tiny_root):
    config = {"root": tiny_root, "batch_size": 8, "workers": 0}
    loader = build(config)
    batches_of(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    again = build(config)
    again.load_state_dict(state)
    ref = build(config)
    batches_of(ref)
    assert _same(batches_of(again), batches_of(ref))


@pytest.mark.parametrize("change,match", [
    ({"seed": 9}, "seed: saved 5, this loader 9"),
    ({"batch_size": 4}, "batch_size: saved 3, this loader 4"),
    ({"world_size": 2, "rank": 1, "seed": 6}, "seed: saved 5, this loader 6"),  # world_size may differ
])
def test_states_of_other_loaders_are_refused(tiny_root, change, match):
    config = {"root": tiny_root, "batch_size": 3, "workers": 0, "seed": 5}
    state = build(config).state_dict()
    with pytest.raises(coordl.ConfigError, match=match):
        build(dict(config, **change)).load_state_dict(state)


def test_another_world_size_is_refused_without_coordls_plan():
    """A DistributedSampler's order depends on its world size: no elastic resume there."""
    data = torch.utils.data.TensorDataset(torch.arange(37))
    state = coordl.DataLoader(data, batch_size=4, shuffle=True, rank=0, world_size=2).state_dict()
    other = coordl.DataLoader(data, batch_size=4, shuffle=True, rank=0, world_size=3)
    with pytest.raises(coordl.ConfigError, match=r"world_size: saved 2, this loader 3.*coordl's own plan"):
        other.load_state_dict(state)
    with pytest.raises(coordl.ConfigError, match="not a coordl.DataLoader state"):
        other.load_state_dict([state, state])


def test_other_dataset_and_unknown_versions_are_refused(tiny_root, photo_root):
    state = build({"root": tiny_root, "batch_size": 3, "workers": 0}).state_dict()
    other = build({"root": photo_root, "batch_size": 3, "workers": 0})
    with pytest.raises(coordl.ConfigError, match="dataset: saved"):
        other.load_state_dict(state)
    with pytest.raises(coordl.ConfigError, match="version 99 is not known"):
        other.load_state_dict(dict(state, version=99))
    with pytest.raises(coordl.ConfigError, match="not a coordl.DataLoader state"):
        other.load_state_dict([1, 2])


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(23))


def test_an_iterable_dataset_is_replayed_to_its_position():
    loader = coordl.DataLoader(_Stream(), batch_size=5)
    it = iter(loader)
    got = [next(it).tolist() for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["batches"] == 2 and got == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    again = coordl.DataLoader(_Stream(), batch_size=5)
    again.load_state_dict(state)
    it = iter(again)
    assert [b.tolist() for b in it] == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19], [20, 21, 22]]
    assert again.state_dict()["batches"] == 0 and again.state_dict()["epoch"] == 1


def _tensor_state(**fields):
    """A valid state of a 10-batch TensorDataset loader (torch's RandomSampler), with `fields` replaced."""
    torch.manual_seed(0)
    loader = build({"tensor": True, "batch_size": 4})
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    for key, value in fields.items():
        if value is _DROP:
            del state[key]
        else:
            state[key] = value
    return loader, state


_DROP = object()


@pytest.mark.parametrize("fields,match", [
    ({"batches": 10**9}, r"batches=1000000000 \(int\) must be an int >= 0 and <= 10 "
                         r"\(the batches per epoch"),
    ({"batches": 11}, r"batches=11 .*<= 10"),
    ({"batches": -1}, r"batches=-1 \(int\) must be an int >= 0"),
    ({"batches": True}, r"batches=True \(bool\)"),
    ({"batches": 1.0}, r"batches=1.0 \(float\)"),
    ({"batches": "1"}, r"batches='1' \(str\)"),
    ({"batches": _DROP}, r"the state has no 'batches'"),
    ({"epoch": True}, r"epoch=True \(bool\)"),
    ({"epoch": -2}, r"epoch=-2"),
    ({"epoch": None}, r"epoch=None \(NoneType\)"),
    ({"version": True}, r"state version True is not known"),
    ({"version": 1.0}, r"state version 1.0 is not known"),
    ({"identity": []}, r"identity=\[\] \(list\) must be a dict with the keys"),
    ({"identity": None}, r"identity=None \(NoneType\)"),
    ({"identity": _DROP}, r"the state has no 'identity'"),
    ({"sampler": "x"}, r"sampler='x' must be null"),
    ({"sampler": {"seed": True}}, r"sampler\['seed'\]=True \(bool\)"),
    ({"sampler": {"seed": 2**70}}, r"sampler\['seed'\]=1180591620717411303424 \(int\)"),
    ({"sampler": {"seed": 1, "x": 2}}, r"must be null, \{'seed': int\}"),
    ({"sampler": {"generator_state": "@@"}}, r"generator_state'\]='@@' must be base64 of a 5056-byte"),
    ({"sampler": {"generator_state": "AAAA"}}, r"must be base64 of a 5056-byte"),
])
def test_every_field_of_a_hostile_state_is_refused_by_name(fields, match):
    loader, state = _tensor_state(**fields)
    assert len(loader) == 10
    with pytest.raises(coordl.ConfigError, match=match):
        loader.load_state_dict(state)


@pytest.mark.parametrize("key,value", [("drop_last", 0), ("batch_size", 4.0), ("batch_size", True),
                                       ("items", "37")])
def test_an_identity_value_of_another_type_is_another_loader(key, value):
    loader, state = _tensor_state()
    state["identity"][key] = value
    with pytest.raises(coordl.ConfigError, match=f"{key}: saved {value!r}, this loader"):
        loader.load_state_dict(state)


def test_the_last_batch_of_an_epoch_is_a_legal_state_for_the_next_epoch():
    _, state = _tensor_state(batches=10)
    loader = build({"tensor": True, "batch_size": 4})   # a fresh loader, as in a fresh process
    loader.load_state_dict(state)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (1, 0)
    assert len(list(loader)) == 10
