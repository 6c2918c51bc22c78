"""plan.py: the epoch order and batches are pure functions; late joiners start at a boundary
and get their own epochs."""

import numpy as np
import pytest

from coordl.coordinator.plan import Plan
from coordl.epochs import sampling
from coordl.errors import ConfigError


def test_order_is_a_permutation_per_epoch_and_a_pure_function():
    plan = Plan(1000, 64, seed=3)
    a, b = plan.order(0), plan.order(1)
    assert sorted(a.tolist()) == list(range(1000)) and sorted(b.tolist()) == list(range(1000))
    assert not np.array_equal(a, b)
    assert np.array_equal(a, Plan(1000, 64, seed=3).order(0))  # another process computes the same
    assert not np.array_equal(a, Plan(1000, 64, seed=4).order(0))
    assert not a.flags.writeable


def test_the_order_is_the_one_every_loader_uses():
    for shuffle in (True, False):
        plan = Plan(50, 5, seed=7, shuffle=shuffle)
        for epoch in range(3):
            assert np.array_equal(plan.order(epoch), sampling.epoch_order(50, 7, epoch, shuffle))


def test_batches_cover_each_epoch_once():
    plan = Plan(10, 4, seed=1)
    assert plan.batches_per_epoch == 3 and plan.end_batch(5) is None
    for epoch in range(3):
        batches = [plan.batch(g) for g in range(plan.first_batch(epoch), plan.first_batch(epoch + 1))]
        assert [len(b) for b in batches] == [4, 4, 2] == [plan.batch_len(g) for g in range(3)]
        assert np.array_equal(np.concatenate(batches), plan.order(epoch))
        assert plan.epoch_of(plan.first_batch(epoch) + 2) == epoch


def test_no_shuffle_and_drop_last():
    plan = Plan(10, 4, shuffle=False, drop_last=True, epochs=2)
    assert plan.batch(1).tolist() == [4, 5, 6, 7] and plan.batch(2).tolist() == [0, 1, 2, 3]
    assert plan.batches_per_epoch == 2
    assert plan.end_batch(0) == 4 and plan.end_batch(3) == 10  # 2 epochs for each job


def test_late_joiners_start_at_the_next_epoch_boundary():
    plan = Plan(10, 4)  # 3 batches per epoch
    assert plan.join_epoch(0) == 0      # idle daemon: from the start
    assert plan.join_epoch(1) == 1      # epoch 0 under way: the next one
    assert plan.join_epoch(3) == 1      # the ring still holds epoch 1's first batch
    assert plan.join_epoch(4) == 2


@pytest.mark.parametrize("kw", [dict(items=0, batch_size=1), dict(items=5, batch_size=0),
                                dict(items=3, batch_size=4, drop_last=True),
                                dict(items=3, batch_size=1, epochs=0)])
def test_bad_plans_are_config_errors(kw):
    with pytest.raises(ConfigError):
        Plan(**kw)
