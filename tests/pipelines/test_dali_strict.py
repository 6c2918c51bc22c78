"""The DALI backend is as strict as the CPU backend, file by file and crop by crop (issue 24).

For each broken JPEG (the three DALI used to decode into a picture, and every
corruption of tests/pipelines/test_corrupt.py) and each file of another format
named .jpg, `pipelines/dali.Prep` refuses exactly the (item, epoch, transform)
that `pipelines/cpu.py` refuses: both decide with the same check on the same
crop box. A refusal names the format.
"""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import pytest
from PIL import Image

from coordl.errors import DecodeError
from coordl.pipelines import cpu, crop, dali, roi

sys.path.insert(0, os.path.dirname(__file__))
import jpeg_faults  # noqa: E402
from test_corrupt import corruptions  # noqa: E402

pytest.importorskip("nvidia.dali")

SIZE = 64
EPOCHS = 4


def _cpu_verdicts(raws, transform: str, epoch: int, seed: int = 0) -> list[str | None]:
    """None where the CPU pipeline decodes item k (its item number is k), else its message."""
    out = []
    for k, raw in enumerate(raws):
        try:
            if transform == "val":
                cpu.val(raw, SIZE)
            else:
                cpu.train(raw, SIZE, crop.item_rng(seed, epoch, k))
            out.append(None)
        except DecodeError as e:
            out.append(str(e))
    return out


def _dali_verdicts(raws, transform: str, epoch: int, seed: int = 0) -> tuple[list[str | None], dali.Result]:
    prep = dali.Prep(dali.Recipe(transform, SIZE, seed, layout="HWC"), len(raws), 2)
    prep.submit(raws, list(range(len(raws))), epoch)
    got = prep.take()
    return [None if k in got.kept else str(got.errors[k]) for k in range(len(raws))], got


def _compare(raws, names, transform, epoch):
    want = _cpu_verdicts(raws, transform, epoch)
    got, result = _dali_verdicts(raws, transform, epoch)
    differ = [f"{names[k]}: CPU {want[k]!r}, DALI {got[k]!r}" for k in range(len(raws))
              if (want[k] is None) != (got[k] is None)]
    assert not differ, f"{transform} epoch {epoch}:\n" + "\n".join(differ)
    return want, got, result


@pytest.fixture(scope="module")
def faulty(bench_sample) -> dict[str, bytes]:
    good = bench_sample[0]
    out = {name: make(good) for name, make in jpeg_faults.CORRUPT.items()}
    out.update({f"a {name} file": make(good) for name, make in jpeg_faults.OTHER_FORMATS.items()})
    out["good"] = good
    return out


@pytest.mark.parametrize("transform", ["train", "val"])
def test_the_three_jpegs_and_other_formats_get_the_cpu_verdict(faulty, transform):
    names, raws = list(faulty), list(faulty.values())
    cut_refused = 0
    for epoch in range(EPOCHS if transform == "train" else 1):
        want, got, result = _compare(raws, names, transform, epoch)
        for name in ("stray RST mid-scan", "header + EOI only"):  # refused whatever the crop
            assert got[names.index(name)] is not None, f"{name}: DALI decoded it ({transform}, epoch {epoch})"
        # the cut file's rows above the cut are right: a crop above them is decoded (on the CPU too)
        cut_refused += got[names.index("cut at 60% + EOI")] is not None
        assert got[names.index("good")] is None
        for name in ("a PNG file", "a GIF file", "a BMP file", "a TIFF file"):  # Pillow reads them: so does DALI
            assert got[names.index(name)] is None, got[names.index(name)]
        assert "PNG" in got[names.index("a PNG cut short file")]          # the format is named
        assert "not an image format" in got[names.index("a random bytes file")]
        assert all(isinstance(e, DecodeError) for e in result.errors.values())
    assert cut_refused >= 1  # val's center crop reaches below the cut, and most random crops do


def test_a_gif_is_decoded_like_the_cpu_decodes_it(faulty):
    gif = faulty["a GIF file"]
    _, result = _dali_verdicts([gif], "val", 0)
    ref = cpu.val(gif, SIZE)
    assert np.abs(result.images[0].astype(int) - ref.astype(int)).mean() < 2.0


@pytest.mark.skipif(not roi.AVAILABLE, reason="the _jpegroi extension is not built")
@pytest.mark.parametrize("kind", ["baseline", "restarts"])
def test_every_corruption_gets_the_cpu_verdict_crop_by_crop(bench_sample, kind):
    """test_corrupt.py's corruptions: where the CPU's verdict depends on the crop (an EOI mid-scan
    above or below it), DALI's follows it."""
    raw = bench_sample[0]
    if kind == "restarts":
        buf = io.BytesIO()
        Image.open(io.BytesIO(raw)).save(buf, "JPEG", quality=90, restart_marker_rows=1)
        raw = buf.getvalue()
    broken = corruptions(raw)
    names, raws = list(broken), list(broken.values())
    refused = accepted = 0
    for transform, epochs in (("train", EPOCHS), ("val", 1)):
        for epoch in range(epochs):
            want, _, _ = _compare(raws, names, transform, epoch)
            refused += sum(w is not None for w in want)
            accepted += sum(w is None for w in want)
    assert refused and accepted  # both verdicts were compared
