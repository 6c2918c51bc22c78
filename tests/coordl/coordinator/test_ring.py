"""ring.py: slot states move only along the legal transitions; a slot frees when its last holder lets go."""

import os

import numpy as np
import pytest

from coordl.coordinator import segments
from coordl.coordinator.ring import INDEX, LEGAL, ROWS, STATE, Layout, Ring, SlotState, SlotTable
from coordl.errors import CoordinatorError


def test_legal_transitions_are_the_documented_cycle():
    assert LEGAL[SlotState.FREE] == {SlotState.FILLING}
    assert LEGAL[SlotState.FILLING] == {SlotState.READY, SlotState.FAILED}
    assert LEGAL[SlotState.READY] == LEGAL[SlotState.FAILED] == {SlotState.FREE}


def test_slot_lifecycle_with_holders_and_mirror():
    mirror = np.zeros((3, 4), np.int64)
    table = SlotTable(3, mirror)
    assert table.free_slot() == 0 and table.oldest() is None
    table.claim(0, index=5, epoch=1)
    assert table.state[0] is SlotState.FILLING and mirror[0, STATE] == SlotState.FILLING
    with pytest.raises(RuntimeError, match="illegal transition FILLING -> FILLING"):
        table.claim(0, 6, 1)
    assert table.publish(0, rows=4, holders={1, 2}) is False
    assert mirror[0, INDEX] == 5 and mirror[0, ROWS] == 4 and table.oldest() == 5
    assert table.release(0, 1) is False and table.release(0, 1) is False  # twice is harmless
    table.hold(0, 3)  # a late joiner that needs it
    assert table.release(0, 2) is False and table.release(0, 3) is True
    assert table.state[0] is SlotState.FREE and mirror[0, INDEX] == -1 and table.by_index == {}
    with pytest.raises(RuntimeError, match="illegal"):
        table.publish(0, 4, {1})


def test_failed_and_unneeded_slots():
    table = SlotTable(2)
    table.claim(1, 9, 0)
    assert table.publish(1, 4, holders=set()) is True  # nobody needs it: free at once
    table.claim(1, 10, 0)
    assert table.fail(1, "bad.jpg", {1, 2}) is False and table.error[1] == "bad.jpg"
    assert table.drop(2) == [] and table.drop(1) == [1]  # detaching releases everything
    assert table.counts() == {"free": 2, "filling": 0, "ready": 0, "failed": 0}


def test_ring_segment_layout_and_read_only_attach(tmp_path):
    layout = Layout.images(slots=3, batch_size=4, size=8)
    name = f"{segments.daemon_prefix()}test-ring"
    ring = Ring.create(name, layout, "/tmp/x.sock")
    try:
        assert os.stat(ring.path).st_mode & 0o777 == 0o600
        assert segments.owner(name) == (os.getpid(), segments.proc_start(os.getpid()))
        assert segments.owner_alive(name)
        ring.samples[1, 2] = 7
        ring.labels[1, 2] = 3
        reader = Ring.attach(ring.path, layout)
        assert reader.samples[1, 2].max() == 7 and reader.labels[1, 2] == 3
        assert not reader.samples.flags.writeable
        assert Ring.read_socket_path(ring.path) == "/tmp/x.sock"
        with pytest.raises(CoordinatorError, match="different coordl versions"):
            Ring.attach(ring.path, Layout.images(3, 4, 16))
        reader.close()
    finally:
        ring.unlink()
        ring.close()
    assert not os.path.exists(ring.path)
