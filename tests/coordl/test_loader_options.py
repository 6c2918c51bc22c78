"""coordl.DataLoader's own arguments (coordl/loader/options.py) and the one Binding it attaches to
the dataset copy it works on (coordl/datasets/binding.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import coordl
from coordl.datasets.binding import NO_COUNTERS, Binding
from coordl.loader.options import LoaderOptions
from coordl.loader.stats import Counters

#: what ImageFolder declared for the loader before the binding (issue 26 point 8)
_LOADER_FIELDS = ("counters", "cache", "batch_slots", "_buffers", "drop_page_cache", "coordinator",
                  "_coordinated_epoch")


@pytest.mark.parametrize("kwargs, words", [
    ({"backend": "tpu"}, "backend='tpu' is not known"),
    ({"dali_device": "tpu"}, "dali_device='tpu' must be 'cpu' or 'gpu'"),
    ({"drop_page_cache": "yes"}, "drop_page_cache='yes' must be True, False or None"),
    ({"reuse_buffers": 1}, "reuse_buffers=1 must be True, False or None"),
    ({"rank": 2, "world_size": 2}, r"rank=2 must be an int in \[0, world_size=2\)"),
    ({"world_size": 0}, "world_size=0 must be an int >= 1"),
    ({"coordinator": 7}, "coordinator=7 must be the daemon's address"),
    ({"backend": "dali", "coordinator": "unix:///x.sock"}, "backend='dali' with coordinator="),
])
def test_each_bad_argument_is_refused_naming_it(tiny_root, kwargs, words):
    with pytest.raises(coordl.ConfigError, match=words):
        LoaderOptions(**kwargs)
    with pytest.raises(coordl.ConfigError, match=words):  # before any work: no binding, no workers
        coordl.DataLoader(coordl.ImageFolder(tiny_root, size=32), batch_size=4, **kwargs)


def test_options_are_frozen_and_what_the_loader_was_built_with(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="val", size=32)
    loader = coordl.DataLoader(ds, batch_size=4, rank=1, world_size=2, reuse_buffers=False)
    assert loader.options == LoaderOptions(rank=1, world_size=2, reuse_buffers=False)
    assert (loader.rank, loader.world_size, loader.reuse_buffers) == (1, 2, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loader.options.rank = 0  # type: ignore[misc]
    # a framework re-creating the loader passes the same arguments: equal options, the same binding
    again = coordl.DataLoader(loader.dataset, batch_size=4, rank=1, world_size=2, reuse_buffers=False)
    assert again.options == loader.options and again.dataset is loader.dataset
    assert again.dataset.binding.counters is loader.dataset.binding.counters
    with pytest.raises(coordl.ConfigError, match="cache= and drop_page_cache= need a coordl dataset"):
        coordl.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4)), drop_page_cache=True)


def test_bind_attaches_one_binding_and_the_users_dataset_declares_none_of_the_loaders_fields(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
    assert not set(_LOADER_FIELDS) & set(vars(ds))  # (failed before: ImageFolder declared all seven)
    assert ds.binding is None and not ds.is_bound
    assert (ds.counters, ds.cache, ds.drop_page_cache, ds.batch_slots, ds.coordinator) == \
        (NO_COUNTERS, None, False, 0, None)
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=2, reuse_buffers=True)
    bound = loader.dataset
    assert set(vars(bound)) - set(vars(ds)) == {"binding"} and isinstance(bound.binding, Binding)
    binding = bound.binding
    assert isinstance(binding.counters, Counters) and binding.counters.workers == 2
    assert bound.counters is binding.counters and bound.batch_slots == binding.batch_slots > 0
    assert (binding.cache, binding.drop_page_cache, binding.coordinator, binding.buffers) == (None, False, None, None)
    assert ds.binding is None  # the user's dataset never changes
    for batch in loader:  # workers reuse buffers through the binding (their own, per process)
        del batch
    assert loader.stats()["samples"] == 40 and binding.buffers is None  # made in the workers only
    with pytest.raises(AttributeError, match=r"ImageFolder.cache is the loader's"):
        bound.cache = "8GiB"
    with pytest.raises(AttributeError, match=r"ImageFolder.counters is the loader's"):
        ds.counters = Counters(0)
    ds.counters = NO_COUNTERS  # the unbound default, as subclasses written before the binding set it
    other = ds.bind(Binding(Counters(0)))
    assert other.binding is not binding and other.cache is None and ds.binding is None
