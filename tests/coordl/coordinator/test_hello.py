"""hello.py without processes: a job attaches only when nothing that changes a batch differs."""

import dataclasses

import coordl
from coordl.coordinator import protocol as p
from coordl.coordinator.hello import mismatch
from coordl.coordinator.plan import Plan


def _hello(ds, **change) -> p.Hello:
    hello = p.Hello(p.VERSION, ds.fingerprint, ds.root, len(ds), ds.transform, ds.size, ds.seed,
                    ds.on_error, 4, True, False, 1, [3, ds.size, ds.size], "uint8")
    return dataclasses.replace(hello, **change)


def test_the_same_settings_attach_and_each_difference_is_named(tiny_root):
    ds = coordl.ImageFolder(tiny_root, size=32)
    plan = Plan(len(ds), 4)
    assert mismatch(_hello(ds), ds, plan) is None
    text = mismatch(_hello(ds, items=41, seed=1, size=64, shuffle=False), ds, plan)
    assert text.startswith("the job differs from the coordinator in 4 things that change a batch: ")
    assert "dataset fingerprint" in text and "(41 items in" in text
    assert "seed=1 (job) != the daemon's seed=0 (--seed 0)" in text
    assert "size=64 (job) != the daemon's size=32 (--size 32)" in text
    assert text.endswith("(coordl serve --seed 1 --size 64 --no-shuffle)")


def test_another_protocol_version_is_refused_first(tiny_root):
    ds = coordl.ImageFolder(tiny_root, size=32)
    text = mismatch(_hello(ds, version=p.VERSION - 1, seed=9), ds, Plan(len(ds), 4))
    assert text.startswith(f"protocol version {p.VERSION - 1} (job) != {p.VERSION} (daemon)")
