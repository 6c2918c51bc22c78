"""coordl.DataLoader(..., backend="dali") on the CPU: batches, counters, cache reads, errors, determinism."""

from __future__ import annotations

import io
import os
import shutil
import warnings

import numpy as np
import pytest
import torch
from coordl_tests_loaderhelp import batches_of, counts_of

import coordl
from coordl.cache import shm
from coordl.loader import dali as dali_loader
from coordl.pipelines import dali

pytest.importorskip("nvidia.dali")


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture
def own_root(tiny_root, tmp_path):
    """A copy of tiny_root: a dataset (fingerprint, cache, bad files) of this test alone."""
    root = str(tmp_path / "data")
    shutil.copytree(tiny_root, root, copy_function=shutil.copy)
    return root


def test_shapes_labels_order_and_counters_match_the_cpu_backend(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=40, seed=5)
    cpu = coordl.DataLoader(ds, batch_size=12, shuffle=True)
    gpu_less = coordl.DataLoader(ds, batch_size=12, shuffle=True, backend="dali")
    assert len(gpu_less) == len(cpu) == 4
    for epoch in range(2):
        want = batches_of(cpu)
        it = iter(gpu_less)
        assert len(it) == 4
        got: list = []

        def consume(it=it, got=got):
            got.extend((i.clone(), t.clone()) for i, t in it)
        delta = counts_of(gpu_less, consume)
        assert gpu_less.epoch == epoch
        assert [g[0].shape for g in got] == [w[0].shape for w in want]
        assert got[0][0].shape == (12, 3, 40, 40) and got[-1][0].shape == (4, 3, 40, 40)
        assert all(g[0].dtype == torch.uint8 and g[1].dtype == torch.int64 for g in got)
        for (gi, gl), (wi, wl) in zip(got, want):
            assert torch.equal(gl, wl)                       # same order, same labels
            assert _psnr(gi, wi) >= 35.0                     # same crops and flips
        assert delta["decodes"] == delta["samples"] == delta["storage_reads"] == len(ds)
        assert delta["storage_bytes"] == ds.manifest.total_bytes and delta["errors_skipped"] == 0
    labels = torch.cat([g[1] for g in got])
    assert sorted(labels.tolist()) == sorted(ds.manifest.labels.tolist())


def test_val_is_close_to_the_cpu_backends_val(photo_root):
    ds = coordl.ImageFolder(photo_root, transform="val")
    want = batches_of(coordl.DataLoader(ds, batch_size=8))
    got = batches_of(coordl.DataLoader(ds, batch_size=8, num_workers=2, backend="dali"))
    assert len(got) == len(want) == 3
    psnrs = []
    for (gi, gl), (wi, wl) in zip(got, want):
        assert gi.shape == wi.shape == (8, 3, 224, 224) and torch.equal(gl, wl)
        psnrs += [_psnr(a, b) for a, b in zip(gi, wi)]
    print(f"DALI val vs CPU val: min {min(psnrs):.1f} dB over {len(psnrs)} images")
    assert min(psnrs) >= 35.0


def test_half_cache_epoch_two_reads_exactly_the_uncached_items(own_root):
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    n, total = len(ds), ds.manifest.total_bytes
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, cache=total // 2,
                               backend="dali")
    bound = loader.dataset
    try:
        first = counts_of(loader, lambda: batches_of(loader))
        assert first["storage_reads"] == n and first["storage_bytes"] == total
        assert first["cache_misses"] == n and first["cache_inserts"] == loader.stats()["cache_items"]
        uncached = [i for i in range(n) if bound.cache.get(i) is None]
        assert 0 < len(uncached) < n
        sizes = ds.manifest.sizes
        for _ in range(2):
            later = counts_of(loader, lambda: batches_of(loader))
            assert later["storage_reads"] == len(uncached)
            assert later["storage_bytes"] == sum(int(sizes[i]) for i in uncached)
            assert later["cache_hits"] == n - len(uncached) and later["cache_inserts"] == 0
            assert later["decodes"] == later["samples"] == n
    finally:
        bound.cache.drop()
        shm.unlink(os.path.join(shm.SHM_DIR, shm.segment_name(ds.fingerprint)))


def test_deterministic_per_seed_and_epoch_whatever_the_thread_count(tiny_root):
    def run(seed, workers, epochs=2):
        ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=seed)
        loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers, backend="dali")
        return [torch.cat([b[0] for b in batches_of(loader)]) for _ in range(epochs)]

    a, b = run(1, 0), run(1, 2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], a[1])                       # a new epoch, new order and crops
    assert not torch.equal(a[0], run(2, 1, epochs=1)[0])     # another seed
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=1)
    resumed = coordl.DataLoader(ds, batch_size=8, shuffle=True, backend="dali")
    resumed.set_epoch(1)
    assert torch.equal(torch.cat([x[0] for x in batches_of(resumed)]), a[1])


def test_thread_mapping():
    assert [dali_loader.dali_threads(w) for w in (0, 1, 2, 8)] == [1, 1, 2, 8]


def _corrupt(root: str) -> tuple[str, str]:
    ds = coordl.ImageFolder(root)
    garbage, cut = ds.manifest.path(3), ds.manifest.path(17)
    with open(garbage, "wb") as f:
        f.write(b"this is not a JPEG")
    with open(cut, "rb") as f:
        raw = f.read()
    with open(cut, "wb") as f:
        f.write(raw[: len(raw) // 2])
    return garbage, cut


def test_on_error_skip_drops_and_counts(own_root):
    _corrupt(own_root)
    ds = coordl.ImageFolder(own_root, transform="val", size=32, on_error="skip")
    loader = coordl.DataLoader(ds, batch_size=8, backend="dali")
    got: list = []
    delta = counts_of(loader, lambda: got.extend(batches_of(loader)))
    assert sum(len(b[1]) for b in got) == len(ds) - 2
    assert delta["errors_skipped"] == 2 and delta["samples"] == len(ds) - 2 and delta["decodes"] == len(ds)
    assert [len(b[1]) for b in got] == [7, 8, 7, 8, 8]       # items 3 and 17 dropped from their batches
    want = [int(ds.manifest.labels[i]) for i in range(len(ds)) if i not in (3, 17)]
    assert torch.cat([b[1] for b in got]).tolist() == want


def test_on_error_raise_names_the_file(own_root):
    garbage, _ = _corrupt(own_root)
    ds = coordl.ImageFolder(own_root, transform="val", size=32)
    loader = coordl.DataLoader(ds, batch_size=8, backend="dali")
    with pytest.raises(coordl.SampleError, match=f"{garbage}: not an image format.*on_error='skip'"):
        batches_of(loader)


def test_a_file_dali_cannot_decode_names_the_file(own_root):
    from PIL import Image

    ds = coordl.ImageFolder(own_root)
    victim = ds.manifest.path(9)
    buf = io.BytesIO()
    Image.open(victim).save(buf, "PNG")
    png = buf.getvalue()
    with open(victim, "wb") as f:                           # a cut PNG behind a .jpg name
        f.write(png[: len(png) // 2])
    loader = coordl.DataLoader(coordl.ImageFolder(own_root, transform="val", size=32), batch_size=8,
                               backend="dali")
    with pytest.raises(coordl.SampleError, match=f"{victim}: DALI cannot decode it"):
        batches_of(loader)
    skip = coordl.DataLoader(coordl.ImageFolder(own_root, transform="val", size=32, on_error="skip"),
                             batch_size=8, backend="dali")
    assert sum(len(b[1]) for b in batches_of(skip)) == len(ds) - 1


def test_what_the_dali_backend_refuses(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform=None)
    with pytest.raises(coordl.ConfigError, match="transform=None"):
        iter(coordl.DataLoader(ds, batch_size=4, backend="dali"))
    ds = coordl.ImageFolder(tiny_root, transform="val", size=32)
    with pytest.raises(coordl.ConfigError, match="collate_fn"):
        iter(coordl.DataLoader(ds, batch_size=4, collate_fn=lambda b: b, backend="dali"))
    with pytest.raises(coordl.ConfigError, match="batch_size=None"):
        iter(coordl.DataLoader(ds, batch_size=None, backend="dali"))
    with pytest.raises(coordl.ConfigError, match="dali_device='tpu'"):
        dl = coordl.DataLoader(ds, batch_size=4, backend="dali")
        dali_loader.dali_epoch(dl, dl._index_sampler, dl.dataset, device="tpu")
    if dali_loader.gpu_count() == 0:  # the message names the loader's argument, dali_device=
        with pytest.raises(coordl.ConfigError, match=r"dali_device='gpu' but .*no CUDA device.*"
                                                     r"use dali_device='cpu'"):
            iter(coordl.DataLoader(ds, batch_size=4, backend="dali", dali_device="gpu"))


def test_num_workers_are_dali_threads_so_torch_warns_of_no_processes(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="val", size=32)
    many = 4 * (os.cpu_count() or 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = coordl.DataLoader(ds, batch_size=8, num_workers=many, backend="dali")
        assert sum(len(labels) for _, labels in loader) == len(ds)
    assert not [w for w in caught if "worker processes" in str(w.message)], [str(w.message) for w in caught]
    with pytest.warns(UserWarning, match="worker processes"):  # the CPU backend's are processes: kept
        coordl.DataLoader(ds, batch_size=8, num_workers=many)


def test_an_unfinished_epoch_then_a_full_one(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="val", size=32)
    loader = coordl.DataLoader(ds, batch_size=8, backend="dali")
    it = iter(loader)
    next(it)
    it.close()
    assert sum(len(b[1]) for b in batches_of(loader)) == len(ds)
    assert dali.INSTALL_HINT.startswith("pip install -e '.[dali]'")


def test_state_dict_mid_epoch_resumes_the_remaining_batches(tiny_root):
    def loader():
        ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=4)
        return coordl.DataLoader(ds, batch_size=8, shuffle=True, backend="dali")

    whole = loader()
    batches_of(whole)                                          # epoch 0
    want = batches_of(whole)                                   # epoch 1, uninterrupted
    first = loader()
    batches_of(first)
    it = iter(first)
    head = [next(it), next(it)]
    state = first.state_dict()
    it.close()
    again = loader()
    again.load_state_dict(state)
    rest = batches_of(again)
    assert len(rest) == len(want) - 2
    for (gi, gl), (wi, wl) in zip(head + rest, want):
        assert torch.equal(gi, wi) and torch.equal(gl, wl)


def test_a_file_gone_from_storage_is_skipped_or_named(own_root):
    ds = coordl.ImageFolder(own_root, transform="val", size=32, on_error="skip")
    strict = coordl.ImageFolder(own_root, transform="val", size=32)
    gone = ds.manifest.path(21)
    os.unlink(gone)                                         # after the scan: fetch fails
    loader = coordl.DataLoader(ds, batch_size=8, backend="dali")
    got: list = []
    delta = counts_of(loader, lambda: got.extend(batches_of(loader)))
    assert delta["errors_skipped"] == 1 and delta["samples"] == len(ds) - 1
    assert delta["decodes"] == len(ds) - 1                  # never handed to the decoder
    with pytest.raises(coordl.SampleError, match=f"{gone}: cannot read the file"):
        batches_of(coordl.DataLoader(strict, batch_size=8, backend="dali"))
