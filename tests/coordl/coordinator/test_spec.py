"""spec.py and the sample spec on the wire and in the ring, without processes: what a dataset's rows
are, how Hello and Welcome carry and check it, a ring of float32 rows, a job refused naming both specs."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import numpy as np
import pytest
import torch

import coordl
from coordl.coordinator import protocol as p
from coordl.coordinator import segments
from coordl.coordinator.hello import mismatch
from coordl.coordinator.plan import Plan
from coordl.coordinator.ring import Layout, Ring
from coordl.coordinator.spec import SampleSpec, dataset_spec, served_spec
from coordl.errors import ConfigError, CoordinatorError

HERE = os.path.dirname(os.path.abspath(__file__))


def _vectors(**kw):
    spec = importlib.util.spec_from_file_location("vectors", os.path.join(HERE, "vectors.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Vectors(**kw)


class Odd(coordl.CoordlDataset):
    """A dataset whose samples the ring cannot hold (bool tensors), or that says so (`spec`)."""

    def __init__(self, text: bool = False) -> None:
        super().__init__()
        self.text = text

    def __len__(self) -> int:
        return 3

    @property
    def fingerprint(self) -> str:
        return "odd"

    def read(self, i: int) -> bytes:
        return b"x"

    def prep(self, raw, i: int, epoch: int | None = None):
        return ("a sample" if self.text else torch.zeros(2, dtype=torch.bool)), 0



class Said(Odd):
    """A dataset that says its spec (sample_spec overridden: nothing is prepared)."""

    def __init__(self, spec) -> None:
        super().__init__()
        self.spec = spec

    def sample_spec(self):
        return self.spec


def test_specs_of_datasets(tiny_root):
    assert dataset_spec(_vectors(), "t") == SampleSpec((4,), "float32")
    image = dataset_spec(coordl.ImageFolder(tiny_root, size=32), "t")
    assert image == SampleSpec((32, 32, 3), "uint8", True) and image.delivered == (3, 32, 32)
    assert served_spec(_vectors(), 16, "t") == SampleSpec.image(16)  # --size N with a user's dataset
    assert served_spec(_vectors(length=7), None, "t").describe() == "float32 (7,)"
    with pytest.raises(ConfigError, match=r"Odd.sample_spec\(\) gave \(\(2,\), 'bool'\) \(its first item's, "
                                          r"prepared\), which the coordinator's ring cannot hold"):
        dataset_spec(Odd(), "coordinator=")
    with pytest.raises(ConfigError, match=r"prep\(0\) returned \(str, int\), which the sample spec cannot take"):
        dataset_spec(Odd(text=True), "coordinator=")
    with pytest.raises(ConfigError, match=r"Said.sample_spec\(\) gave \(\(2,\), 'bool'\), which the coordinator's "
                                          r"ring cannot hold .*dtype among uint8, int16"):
        dataset_spec(Said(((2,), "bool")), "coordinator=")
    assert dataset_spec(Said(((2, 3), "int16")), "t") == SampleSpec((2, 3), "int16")  # said, not prepared


def test_the_spec_on_the_wire_is_checked():
    welcome = p.Welcome(1, 2, "/dev/shm/x", 8, 4, [1, 8000], "float32", False, 10, None, 0, 0)
    assert p.FrameReader(p.TO_JOB, p.MAX_REPLY).feed(welcome.encode()) == [welcome]
    for change, error in (({"sample_dtype": "bool"}, "sample dtype 'bool' is not one of"),
                          ({"sample_shape": [0]}, "is not at most 7 dimensions of 1 to"),
                          ({"sample_shape": [1] * 8}, "is not at most 7 dimensions"),
                          ({"sample_hwc": True}, r"an image ring's rows are uint8 \(N, N, 3\)")):
        fields = {**welcome.__dict__, **change}
        with pytest.raises(p.ProtocolError, match=error):
            p.Welcome(**fields)
    body = dict(welcome.__dict__, type="welcome", sample_shape=["1", 2])
    import msgpack
    with pytest.raises(p.ProtocolError, match="field 'sample_shape'"):
        p.decode(msgpack.packb(body), p.TO_JOB)


def test_a_failure_of_the_dataset_config_is_its_own_kind():
    failure = p.Failure.from_exception(ConfigError("prep(5) returned float32 (5,)"), lambda i: "")
    assert failure.kind == "config"
    assert p.BatchFailed.of(3, failure).failure == failure


def test_a_ring_of_float32_rows_and_its_recorded_layout():
    layout = Layout(slots=2, batch_size=3, shape=(1, 5), dtype="float32")
    assert layout.slot_sample_bytes == 3 * 5 * 4
    ring = Ring.create(f"{segments.daemon_prefix()}test-spec-ring", layout, "/tmp/x.sock")
    try:
        ring.samples[1, 2] = np.arange(5, dtype=np.float32)
        reader = Ring.attach(ring.path, layout)
        assert reader.samples.dtype == np.float32 and reader.samples.shape == (2, 3, 1, 5)
        assert reader.samples[1, 2].tolist() == [[0, 1, 2, 3, 4]]
        reader.close()
        with pytest.raises(CoordinatorError, match="records another layout"):  # the same bytes, other rows
            Ring.attach(ring.path, Layout(2, 3, (5,), "float32"))
        with pytest.raises(CoordinatorError, match="records another layout"):
            Ring.attach(ring.path, Layout(2, 3, (1, 10), "float16"))
    finally:
        ring.unlink()
        ring.close()


def test_a_job_whose_samples_differ_from_a_dataset_spec_is_refused_naming_both():
    ds = _vectors()
    plan = Plan(len(ds), 4)
    root, transform, size = ds.served_as()
    hello = p.Hello(p.VERSION, ds.fingerprint, root, len(ds), transform, size, 0, "raise", 4, True, False, 1,
                    [4], "float32")
    spec = SampleSpec((4,), "float32")
    assert mismatch(hello, ds, plan, spec) is None
    text = mismatch(dataclasses.replace(hello, sample_shape=[5], sample_dtype="float64"), ds, plan, spec)
    assert text is not None and "samples float64 (5,) (the job's dataset's sample_spec()) != the daemon's " \
        "float32 (4,) (its dataset's at its start): build the job's dataset with the daemon's --dataset-args" in text
    # an image ring (--size): the size field decides, the samples a job says are not compared
    assert mismatch(dataclasses.replace(hello, sample_shape=[5]), ds, plan, SampleSpec.image(16)) is None
