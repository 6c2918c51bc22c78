"""coordl/manifest/threads.py: spread_map is [fn(x) for x in items], on helper threads only
once the calling thread was seen blocked (sleeping stands in for a cold disk here)."""

from __future__ import annotations

import threading
import time

import pytest

from coordl.manifest import threads as manifest_threads


def _record(seen: list[str], nap: float = 0.0):
    def fn(x: int) -> int:
        seen.append(threading.current_thread().name)
        if nap:
            time.sleep(nap)
        return x * x
    return fn


def test_results_are_in_order_and_on_the_calling_thread_with_one_thread():
    seen: list[str] = []
    assert manifest_threads.spread_map(_record(seen, 0.03), list(range(5)), threads=1) == [0, 1, 4, 9, 16]
    assert set(seen) == {threading.current_thread().name}


def test_blocked_items_bring_helper_threads_and_keep_the_order():
    seen: list[str] = []
    items = list(range(40))
    out = manifest_threads.spread_map(_record(seen, 0.025), items, threads=4, name="t-helper")
    assert out == [x * x for x in items]
    assert len(seen) == 40
    assert seen[0] == threading.current_thread().name  # the first item runs before anything is known
    assert {n for n in seen if n.startswith("t-helper-")} == {"t-helper-0", "t-helper-1", "t-helper-2"}
    assert not [t for t in threading.enumerate() if t.name.startswith("t-helper-")]  # all joined


def test_until_stops_the_rest():
    out = manifest_threads.spread_map(lambda x: x < 3, list(range(10)), threads=1, until=lambda ok: not ok)
    assert out == [True, True, True, False] + [None] * 6


def test_an_exception_stops_the_rest_and_is_raised_on_the_caller(monkeypatch):
    monkeypatch.setattr(manifest_threads, "BLOCKED_MIN_NS", 0)  # helpers from the first item on
    done: list[int] = []

    def fn(x: int) -> int:
        time.sleep(0.002)
        if x == 5:
            raise ValueError("item 5")
        done.append(x)
        return x

    with pytest.raises(ValueError, match="item 5"):
        manifest_threads.spread_map(fn, list(range(200)), threads=4)
    assert 5 not in done and len(done) < 199
