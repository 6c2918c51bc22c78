"""DataLoader(device=...) (coordl/loader/devprep.py) on CPU tensors: workers send bytes, this process
prepares; the same items, labels and pixels (PSNR >= 30 dB) as the CPU pipeline, counters, bad files."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import torch

import coordl
from coordl.errors import ConfigError, SampleError


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _train_epoch(root, workers: int, **kw):
    loader = coordl.DataLoader(coordl.ImageFolder(root, "train", size=64, seed=3), batch_size=8, shuffle=True,
                               num_workers=workers, **kw)
    return [(i.clone(), t.clone()) for i, t in loader], loader.stats()


@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_as_the_cpu_pipeline_within_30db(photo_root, workers):
    ref, ref_stats = _train_epoch(photo_root, 0)
    got, stats = _train_epoch(photo_root, workers, device="cpu", decoder="cpu")
    assert len(got) == len(ref) == 3
    for (gi, gl), (ri, rl) in zip(got, ref):
        assert gi.shape == ri.shape and gi.dtype == torch.uint8 and torch.equal(gl, rl)
        assert min(_psnr(a, b) for a, b in zip(gi, ri)) >= 30.0
    assert stats["gpu_decodes"] == 24 and stats["gpu_cpu_fallbacks"] == 0 and stats["gpu_prep_us"] > 0
    assert stats["samples"] == ref_stats["samples"] == 24 and stats["decodes"] == ref_stats["decodes"]


def test_a_file_the_decoder_fails_on_raises_naming_it_or_is_skipped(photo_root, tmp_path):
    root = str(tmp_path / "data")
    shutil.copytree(photo_root, root)
    cls = sorted(os.listdir(root))[0]
    name = sorted(os.listdir(os.path.join(root, cls)))[0]
    path = os.path.join(root, cls, name)
    raw = open(path, "rb").read()
    k = raw.index(b"\xff\xc4")
    with open(path, "wb") as f:  # a bogus Huffman table: header and markers pass, the decode fails
        f.write(raw[:k + 5] + bytes([0xFF] * 16) + raw[k + 21:])
    loader = coordl.DataLoader(coordl.ImageFolder(root, "val", size=32, manifest_cache="off"), batch_size=24,
                               device="cpu", decoder="cpu")
    with pytest.raises(SampleError, match=name):
        next(iter(loader))
    loader = coordl.DataLoader(coordl.ImageFolder(root, "val", size=32, manifest_cache="off", on_error="skip"),
                               batch_size=24, device="cpu", decoder="cpu")
    (images, labels), = list(loader)
    stats = loader.stats()
    assert images.shape[0] == len(labels) == 23 and stats["errors_skipped"] == 1 and stats["samples"] == 23


def test_resume_mid_epoch_gives_the_same_batches(photo_root):
    def loader():
        return coordl.DataLoader(coordl.ImageFolder(photo_root, "train", size=32, seed=5), batch_size=8,
                                 shuffle=True, device="cpu", decoder="cpu")
    first = loader()
    it = iter(first)
    next(it)
    state = first.state_dict()
    rest = [(i.clone(), t.clone()) for i, t in it]
    again = loader()
    again.load_state_dict(state)
    resumed = list(again)
    assert len(resumed) == len(rest) == 2
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resumed, rest))


def test_bad_arguments_are_refused(photo_root):
    ds = coordl.ImageFolder(photo_root, None)
    with pytest.raises(ConfigError, match="transform='train' or 'val'"):
        coordl.DataLoader(ds, batch_size=4, device="cpu")
    with pytest.raises(ConfigError, match="device_dtype"):
        coordl.DataLoader(coordl.ImageFolder(photo_root), batch_size=4, device="cpu", device_dtype=torch.int32)
    with pytest.raises(ConfigError, match="decoder='x'"):
        coordl.DataLoader(coordl.ImageFolder(photo_root), batch_size=4, device="cpu", decoder="x")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_batches_are_on_the_gpu(photo_root):
    loader = coordl.DataLoader(coordl.ImageFolder(photo_root, "train", size=64), batch_size=8, device="cuda")
    images, _labels = next(iter(loader))
    assert images.device.type == "cuda" and images.shape == (8, 3, 64, 64)
    assert np.isfinite(loader.stats()["gpu_prep_us"])


# -- overlap: one batch prepared ahead, a fixed pool of output buffers (coordl/loader/devpool.py) --

def _loader(root, **kw):
    ds = coordl.ImageFolder(root, "train", size=32, seed=7, manifest_cache="off", **kw.pop("ds", {}))
    return coordl.DataLoader(ds, batch_size=kw.pop("batch_size", 5), shuffle=True, device="cpu", decoder="cpu", **kw)


def test_pooled_look_ahead_batches_equal_the_unpooled_ones_and_use_at_most_k_buffers(photo_root):
    plain = [(i.clone(), t.clone()) for i, t in _loader(photo_root, device_buffers=0)]
    loader, ptrs, got = _loader(photo_root), set(), []
    for images, labels in loader:  # the loop drops each batch as it asks for the next
        ptrs.add(images.untyped_storage().data_ptr())
        assert images.is_contiguous(memory_format=torch.channels_last)
        got.append((images.clone(), labels.clone()))
    assert len(got) == len(plain) == 5 and got[-1][0].shape[0] == 4  # 24 = 4 x 5 + 4: the last one short
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, plain))
    assert len(ptrs) <= 3 and loader.stats()["gpu_buffer_misses"] == 0
    again = set()
    for images, _labels in loader:  # the pool is the loader's: the next epoch reuses the same buffers
        again.add(images.untyped_storage().data_ptr())
    assert again <= ptrs


def test_batch_k_plus_1_is_prepared_when_batch_k_is_handed_out(photo_root):
    ahead, plain = _loader(photo_root), _loader(photo_root, device_buffers=0)
    next(iter(ahead)), next(iter(plain))
    assert ahead.stats()["samples"] == 10 and plain.stats()["samples"] == 5  # batch 1's items were fetched
    assert ahead.stats()["gpu_decodes"] == plain.stats()["gpu_decodes"] == 5  # counted as batch 0 is handed out


def _with_a_bad_file(photo_root, tmp_path) -> str:
    root = str(tmp_path / "data")
    shutil.copytree(photo_root, root)
    cls = sorted(os.listdir(root))[1]
    path = os.path.join(root, cls, sorted(os.listdir(os.path.join(root, cls)))[0])  # item 8: batch 1
    raw = open(path, "rb").read()
    k = raw.index(b"\xff\xc4")
    with open(path, "wb") as f:  # a bogus Huffman table: header and markers pass, the decode fails
        f.write(raw[:k + 5] + bytes([0xFF] * 16) + raw[k + 21:])
    return root


def test_a_bad_file_prepared_ahead_raises_at_its_own_batch_or_is_skipped(photo_root, tmp_path):
    root = _with_a_bad_file(photo_root, tmp_path)
    for buffers in (3, 0):
        it = iter(coordl.DataLoader(coordl.ImageFolder(root, "val", size=32, manifest_cache="off"), batch_size=5,
                                    device="cpu", decoder="cpu", device_buffers=buffers))
        assert next(it)[0].shape[0] == 5  # batch 0 is handed out although batch 1 (prepared ahead) fails
        with pytest.raises(SampleError):
            next(it)
        assert torch.equal(next(it)[1], torch.tensor([1, 1, 1, 1, 1]))  # batch 2 (items 10-14) after it
    got = {}
    for buffers in (3, 0):
        loader = coordl.DataLoader(coordl.ImageFolder(root, "val", size=32, manifest_cache="off", on_error="skip"),
                                   batch_size=5, device="cpu", decoder="cpu", device_buffers=buffers)
        got[buffers] = [(i.clone(), t.clone()) for i, t in loader]
        assert loader.stats()["errors_skipped"] == 1 and loader.stats()["samples"] == 23
    assert [i.shape[0] for i, _ in got[3]] == [5, 4, 5, 5, 4]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got[3], got[0]))


def test_a_batch_the_user_keeps_is_never_overwritten_and_misses_are_counted(photo_root):
    loader = _loader(photo_root, device_buffers=2)
    kept = list(loader)  # every batch kept: the pool's 2 buffers, then a fresh tensor for each
    assert loader.stats()["gpu_buffer_misses"] == 3
    assert len({i.untyped_storage().data_ptr() for i, _ in kept}) == 5
    plain = list(_loader(photo_root, device_buffers=0))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(kept, plain))
    pooled = {i.untyped_storage().data_ptr() for i, _ in kept[:2]}
    del kept, plain  # the pool's buffers are free again
    first = next(iter(loader))  # batch 0 of epoch 1, in a pool buffer, kept while the whole epoch runs
    copy, at = first[0].clone(), first[0].untyped_storage().data_ptr()
    rest = [i.untyped_storage().data_ptr() for i, _ in loader]
    assert at in pooled and at not in rest and torch.equal(first[0], copy)
    assert loader.stats()["gpu_buffer_misses"] > 3  # the other buffer alone could not hold every batch


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_with_a_batch_prepared_ahead_is_counted_right(photo_root, workers):
    first = _loader(photo_root, num_workers=workers)
    it = iter(first)
    next(it), next(it)  # batch 2 is prepared ahead, not received
    state = first.state_dict()
    rest = [(i.clone(), t.clone()) for i, t in it]
    again = _loader(photo_root)
    again.load_state_dict(state)
    resumed = list(again)
    assert len(resumed) == len(rest) == 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resumed, rest))


def test_the_device_buffers_argument_is_checked(photo_root):
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="device_buffers="):
            _loader(photo_root, device_buffers=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_batches_come_from_a_side_stream_and_the_pool(photo_root):
    loader = coordl.DataLoader(coordl.ImageFolder(photo_root, "train", size=64, seed=7), batch_size=5,
                               device="cuda", decoder="auto")
    it = iter(loader)
    ptrs, sums = set(), []
    for images, _labels in it:
        assert it._side is not None and torch.cuda.current_stream() != it._side
        ptrs.add(images.untyped_storage().data_ptr())
        sums.append(int(images.double().sum()))  # read on the user's stream
    plain = [int(i.double().sum()) for i, _ in coordl.DataLoader(
        coordl.ImageFolder(photo_root, "train", size=64, seed=7), batch_size=5, device="cuda",
        decoder="auto", device_buffers=0)]
    assert sums == plain and len(ptrs) <= 3 and loader.stats()["gpu_buffer_misses"] == 0


# -- a user's own CoordlDataset of JPEGs on the device path --

class _Jpegs(coordl.CoordlDataset):
    """A user's dataset of JPEG files with the device path's contract: transform, size, label(i).
    Its files are ImageFolder's, in ImageFolder's order, so the batches can be compared."""

    transform = "train"

    def __init__(self, root: str, size: int, seed: int, on_error: str = "raise") -> None:
        super().__init__(seed=seed, on_error=on_error)
        m = coordl.ImageFolder(root, manifest_cache="off").manifest
        self.paths, self.labels, self.size = [m.path(i) for i in range(len(m.labels))], m.labels.tolist(), size

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def fingerprint(self) -> str:
        return "jpegs:" + ",".join(f"{p}:{os.stat(p).st_size}" for p in self.paths)

    def read(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as f:
            return f.read()

    def label(self, i: int) -> int:
        return self.labels[i]

    def prep(self, raw, i: int, epoch: int | None = None):
        from coordl.pipelines import cpu

        image = cpu.train(raw, self.size, self.rng(i, epoch))
        return torch.from_numpy(image).permute(2, 0, 1), self.labels[i]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_users_coordl_dataset_of_jpegs_gets_the_cpu_pipelines_batches(photo_root, workers):
    """The same items, labels, crops and flips as ImageFolder's CPU pipeline (PSNR >= 30 dB), and as
    the dataset's own `prep` on the CPU; decodes counted on the device path, `prep` never called."""
    ref, _ = _train_epoch(photo_root, 0)
    ds = _Jpegs(photo_root, 64, seed=3)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers, device="cpu", decoder="cpu")
    got = [(i.clone(), t.clone()) for i, t in loader]
    own = coordl.DataLoader(ds, batch_size=8, shuffle=True)  # the user's prep, on the CPU
    assert len(got) == len(ref) == 3
    for (gi, gl), (ri, rl), (oi, ol) in zip(got, ref, own):
        assert gi.shape == ri.shape and torch.equal(gl, rl) and torch.equal(ol, rl)
        assert torch.equal(oi, ri)  # the user's prep draws from self.rng: ImageFolder's pixels
        assert min(_psnr(a, b) for a, b in zip(gi, ri)) >= 30.0
    stats = loader.stats()
    assert stats["gpu_decodes"] == stats["samples"] == 24 and stats["storage_reads"] == 24


def test_a_users_dataset_with_a_bad_jpeg_raises_naming_the_item_or_skips_it(photo_root, tmp_path):
    root = str(tmp_path / "data")
    shutil.copytree(photo_root, root)
    ds = _Jpegs(root, 32, seed=0)
    k = 5
    raw = open(ds.paths[k], "rb").read()
    h = raw.index(b"\xff\xc4")
    with open(ds.paths[k], "wb") as f:  # a bogus Huffman table: header and markers pass, the decode fails
        f.write(raw[:h + 5] + bytes([0xFF] * 16) + raw[h + 21:])
    loader = coordl.DataLoader(ds, batch_size=24, device="cpu", decoder="cpu")
    with pytest.raises(SampleError, match=f"_Jpegs item {k}:"):
        next(iter(loader))
    loader = coordl.DataLoader(_Jpegs(root, 32, seed=0, on_error="skip"), batch_size=24, device="cpu",
                               decoder="cpu")
    (images, labels), = list(loader)
    stats = loader.stats()
    assert images.shape[0] == len(labels) == 23 and stats["errors_skipped"] == 1 and stats["samples"] == 23
    with open(ds.paths[k], "wb") as f:  # not an image at all: refused by its worker, when planned
        f.write(b"not a jpeg")
    with pytest.raises(SampleError, match=f"_Jpegs item {k}: not an image"):
        list(coordl.DataLoader(_Jpegs(root, 32, seed=0), batch_size=24, device="cpu", decoder="cpu"))


def test_a_users_dataset_without_the_contract_is_refused_saying_what_is_missing(photo_root):
    class NoLabel(_Jpegs):
        label = None  # type: ignore[assignment]

    class NoTransform(_Jpegs):
        transform = None  # type: ignore[assignment]

    with pytest.raises(ConfigError, match=r"NoLabel has no label\(i\)"):
        coordl.DataLoader(NoLabel(photo_root, 32, 0), batch_size=4, device="cpu")
    with pytest.raises(ConfigError, match="NoTransform has no transform='train' or 'val'"):
        coordl.DataLoader(NoTransform(photo_root, 32, 0), batch_size=4, device="cpu")
    bad = _Jpegs(photo_root, 32, 0)
    bad.size = (32,)  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"_Jpegs.size=\(32,\) must be a positive int"):
        coordl.DataLoader(bad, batch_size=4, device="cpu")
