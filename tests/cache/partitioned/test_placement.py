"""Rendezvous placement (cache/partitioned/placement.py): pure, balanced, and stable when the node list changes."""

from __future__ import annotations

import numpy as np
import pytest

from coordl.cache.partitioned import placement

FP = "3f" * 32
NODES = ["host-a:6390/0", "host-b:6390/0", "host-c:6390/0"]


def test_same_owner_whatever_the_order_of_the_list():
    items = np.arange(5000)
    a = placement.owners(placement.node_salts(FP, NODES), items)
    reordered = [NODES[2], NODES[0], NODES[1]]
    b = placement.owners(placement.node_salts(FP, reordered), items)
    assert [NODES[j] for j in a] == [reordered[j] for j in b]
    assert placement.node_of_item(placement.node_salts(FP, NODES), 1234) == a[1234]


def test_balanced_and_dataset_specific():
    counts = placement.items_per_node(placement.node_salts(FP, NODES), 30000)
    assert counts.sum() == 30000
    assert np.all(np.abs(counts - 10000) < 300), counts       # within 3% of an even split
    other = placement.owners(placement.node_salts("77" * 32, NODES), np.arange(30000))
    mine = placement.owners(placement.node_salts(FP, NODES), np.arange(30000))
    assert 0.6 < np.mean(other != mine) < 0.73                 # another dataset is placed independently


def test_losing_a_node_moves_only_its_items():
    items = np.arange(20000)
    before = np.array(NODES)[placement.owners(placement.node_salts(FP, NODES), items)]
    rest = [NODES[0], NODES[2]]
    after = np.array(rest)[placement.owners(placement.node_salts(FP, rest), items)]
    kept = before != NODES[1]
    assert np.array_equal(before[kept], after[kept])
    # hash % N, for comparison, would have moved about half of everything
    moved_mod = np.mean(items % 3 != items % 2)
    assert moved_mod > 0.6 and np.mean(before != after) < 0.36


def test_adding_a_node_moves_items_only_to_it():
    items = np.arange(20000)
    before = np.array(NODES)[placement.owners(placement.node_salts(FP, NODES), items)]
    more = NODES + ["host-d:6390/0"]
    after = np.array(more)[placement.owners(placement.node_salts(FP, more), items)]
    moved = before != after
    assert set(after[moved]) == {"host-d:6390/0"}
    assert 0.22 < moved.mean() < 0.28


def test_one_node_owns_everything_and_names_must_differ():
    assert not placement.owners(placement.node_salts(FP, NODES[:1]), np.arange(100)).any()
    with pytest.raises(ValueError, match="distinct"):
        placement.node_salts(FP, [NODES[0], NODES[0]])


def test_four_to_five_nodes_moves_a_fifth_and_nothing_between_old_nodes():
    """Issue 28 point 3: adding a 5th node moves ~1/5 of the items, all of them to the new node;
    removing one moves exactly its items, each to one of the others."""
    four = [f"10.0.0.{k}:6390/0" for k in range(1, 5)]
    five = four + ["10.0.0.9:6390/0"]
    items = np.arange(50000)
    before = np.array(four)[placement.owners(placement.node_salts(FP, four), items)]
    after = np.array(five)[placement.owners(placement.node_salts(FP, five), items)]
    moved = before != after
    assert abs(moved.mean() - 1 / 5) < 0.01, moved.mean()
    assert set(after[moved]) == {five[-1]}          # none moves between two old nodes
    back = np.array(four)[placement.owners(placement.node_salts(FP, four), items)]
    left = after != back                             # removing the 5th again: only its items move
    assert np.array_equal(left, after == five[-1]) and np.array_equal(back, before)
    three = four[:2] + four[3:]                      # removing an old node: only its items move
    gone = np.array(three)[placement.owners(placement.node_salts(FP, three), items)]
    assert np.array_equal(before != gone, before == four[2])
    assert abs((before != gone).mean() - 1 / 4) < 0.01
