"""`coordl serve --backend dali`: real daemons whose prep workers decode with DALI, real jobs.

What a DALI daemon's batches are checked against: a local
`coordl.DataLoader(backend="dali")` over the same dataset, bit for bit (one
plan, one `crop.item_rng` per item, the same DALI operators: only the
layout differs, HWC in the ring against CHW), and the CPU backend by PSNR
(the two resamplers differ by a few levels), as tests/coordl/test_dali_loader.py does.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import coordl
from coordl.coordinator import segments
from coordl.coordinator.client import status
from coordl.coordinator.config import ServeConfig

pytest.importorskip("nvidia.dali")

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")
N = 40  # items in tiny_root


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _local(root, backend, transform="train", seed=5, **kw):
    ds = coordl.ImageFolder(root, transform=transform, size=32, seed=seed)
    return coordl.DataLoader(ds, batch_size=4, shuffle=True, backend=backend, **kw)


def _sums(loader) -> list[int]:
    """job_main.py's checksum of each batch of one epoch."""
    return [int(images.sum()) + 7 * int(labels.sum()) for images, labels in loader]


def test_a_dali_daemon_feeds_two_jobs_identical_batches(tiny_root, serve, jobs):
    served = serve(tiny_root, epochs=2, min_jobs=2, seed=5, backend="dali")
    running = [jobs(tiny_root, served, seed=5) for _ in range(2)]
    results = [j.result() for j in running]
    for r in results:
        assert r["returncode"] == 0 and r["error"] is None, r["error"]
        assert [e["epoch"] for e in r["epochs"]] == [0, 1]
        assert all(sorted(e["ids"]) == list(range(N)) for e in r["epochs"])  # whole epochs
    assert results[0]["epochs"] == results[1]["epochs"]            # same ids, same pixel sums
    assert max(r["status"]["decodes"] for r in results) == 2 * N  # each batch prepared once
    dali, cpu = _local(tiny_root, "dali"), _local(tiny_root, "cpu")
    for epoch in results[0]["epochs"]:
        # the DALI pipeline's pixels, not the CPU pipeline's
        assert epoch["sums"] == _sums(dali) != _sums(cpu)
    assert served.wait() == 0 and served.segments_left() == []


@pytest.mark.parametrize("transform", ["train", "val"])
def test_batches_are_the_local_dali_backends_and_close_to_the_cpus(tiny_root, serve, transform):
    served = serve(tiny_root, seed=5, transform=transform, backend="dali")
    ds = coordl.ImageFolder(tiny_root, transform=transform, size=32, seed=5)
    job = coordl.DataLoader(ds, batch_size=4, shuffle=True, coordinator=served.address, timeout=60)
    dali, cpu = _local(tiny_root, "dali", transform), _local(tiny_root, "cpu", transform)
    for epoch in range(2):
        psnrs = []
        for k, (got, want, near) in enumerate(zip(job, dali, cpu)):
            images, labels = got
            assert job.epoch == got.epoch == epoch
            assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
            assert torch.equal(labels, want[1]) and torch.equal(labels, near[1])
            assert torch.equal(images, want[0]), f"epoch {epoch} batch {k}"  # bit for bit
            psnrs += [_psnr(a, b) for a, b in zip(images, near[0])]
        assert k == 9 and min(psnrs) >= 35.0 and float(np.mean(psnrs)) < float("inf")
    st = status(served.socket)
    counters = st["counters"]
    assert counters["decodes"] == counters["samples"] >= 2 * N  # it may be preparing epoch 2
    assert (st["backend"], st["dali_device"]) == ("dali", "cpu")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "coordl"), "status", "--socket", served.socket],
                         capture_output=True, text=True, check=True).stdout
    assert "backend dali cpu," in out, out
    job.coordinator.close()


def test_the_cache_serves_every_epoch_after_the_first(tiny_root, serve):
    from coordl.cache.minio import admin

    # one worker: chunks run in order, so no chunk of epoch 1 reads an item before the chunk of
    # epoch 0 that caches it (with two, epoch 1's first chunk may run beside epoch 0's last)
    served = serve(tiny_root, epochs=2, cache="64MiB", backend="dali", workers=1)
    try:
        ds = coordl.ImageFolder(tiny_root, transform="train", size=32)
        job = coordl.DataLoader(ds, batch_size=4, shuffle=True, coordinator=served.address, timeout=60)
        assert [sum(len(labels) for _, labels in job) for _ in range(2)] == [N, N]
        counters = status(served.socket)["counters"]
        assert counters["storage_reads"] == N and counters["cache_inserts"] == N, counters  # epoch 0
        assert counters["cache_hits"] == N and counters["decodes"] == counters["samples"] == 2 * N
        job.coordinator.close()
        assert served.wait() == 0
    finally:
        admin.drop(segments.SHM_DIR, served.status_at_start["fingerprint"][:16])


@pytest.fixture
def bad_root(tiny_root, tmp_path):
    """tiny_root plus, first in three classes: a text file, a PNG cut short (DALI itself fails
    on it) and a dangling link (unreadable): items 0, 11 and 22, in batches 0, 2 and 5."""
    root = tmp_path / "bad"
    shutil.copytree(tiny_root, root)
    classes = sorted(os.listdir(root))
    (root / classes[0] / "0_text.jpg").write_text("this is a text file, not a JPEG\n")
    from PIL import Image

    buf = io.BytesIO()
    Image.open(root / classes[1] / sorted(os.listdir(root / classes[1]))[0]).save(buf, "PNG")
    (root / classes[1] / "0_cut.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    os.symlink(root / "nowhere.jpg", root / classes[2] / "0_dangling.jpg")
    return str(root)


BAD = {0: ("0_text.jpg", "not an image"), 11: ("0_cut.jpg", "DALI cannot decode it"),
       22: ("0_dangling.jpg", "cannot read the file")}


def test_bad_images_fail_their_batch_naming_the_file_or_are_skipped_and_counted(bad_root, serve, drain):
    served = serve(bad_root, backend="dali", no_shuffle=True, epochs=1)
    ds = coordl.ImageFolder(bad_root, transform="train", size=32)
    assert [os.path.basename(ds.manifest.path(i)) for i in BAD] == [name for name, _ in BAD.values()]
    job = coordl.DataLoader(ds, batch_size=4, shuffle=False, coordinator=served.address, timeout=60)
    got, errors = drain(job)
    assert len(errors) == 3 and got == N + 3 - 12
    for text, (name, why) in zip(errors, BAD.values()):
        assert name in text and why in text and "on_error='skip'" in text, text
    job.coordinator.close()

    skipping = serve(bad_root, backend="dali", no_shuffle=True, epochs=1, on_error="skip", name="skip.sock")
    ds = coordl.ImageFolder(bad_root, transform="train", size=32, on_error="skip")
    job = coordl.DataLoader(ds, batch_size=4, shuffle=False, coordinator=skipping.address, timeout=60)
    rows, ids, sizes = 0, [], []
    for batch in job:
        rows += batch[0].shape[0]
        sizes.append(batch[0].shape[0])
        ids += batch.indices.tolist()
        assert torch.equal(batch[1], torch.from_numpy(ds.manifest.labels[batch.indices.numpy()]))
    assert rows == N and sorted(ids) == [i for i in range(N + 3) if i not in BAD]
    assert sizes == [3, 4, 3, 4, 4, 3, 4, 4, 4, 4, 3]
    counters = job.stats()
    assert counters["daemon_errors_skipped"] == 3 and counters["daemon_samples"] == N
    assert counters["daemon_decodes"] == N + 2 and counters["daemon_storage_reads"] == N + 2  # not the link
    job.coordinator.close()  # the last job leaves: --epochs 1 is done
    assert skipping.wait() == 0 and skipping.segments_left() == []


def test_a_mixed_folder_is_skipped_as_the_cpu_backend_skips_it(tiny_root, tmp_path, serve):
    """The broken JPEGs DALI used to decode and other formats named .jpg (issue 24): the daemon's
    DALI workers skip exactly the items a local CPU loader skips, the same rows per batch."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "pipelines"))
    import jpeg_faults

    root = str(tmp_path / "mixed")
    shutil.copytree(tiny_root, root)
    jpeg_faults.add_faults(root)
    ds = coordl.ImageFolder(root, transform="train", size=32, seed=5, on_error="skip")
    local = coordl.DataLoader(ds, batch_size=4, shuffle=False)
    want = [(batch[0].shape[0], batch[1].tolist()) for batch in local]
    want_skipped = local.stats()["errors_skipped"]
    served = serve(root, backend="dali", no_shuffle=True, epochs=1, seed=5, on_error="skip")
    job = coordl.DataLoader(ds, batch_size=4, shuffle=False, coordinator=served.address, timeout=60)
    got = [(batch[0].shape[0], batch[1].tolist()) for batch in job]
    counters = job.stats()
    print(f"CPU {sum(n for n, _ in want)} rows, {want_skipped} skipped; DALI daemon "
          f"{sum(n for n, _ in got)} rows, {counters['daemon_errors_skipped']} skipped")
    assert got == want and counters["daemon_errors_skipped"] == want_skipped >= 4
    job.coordinator.close()
    assert served.wait() == 0 and served.segments_left() == []


def test_what_serve_refuses_for_the_dali_backend(monkeypatch, sockdir, tiny_root):
    with pytest.raises(coordl.ConfigError, match="--dali-device gpu needs --backend dali"):
        ServeConfig(data="/d", batch_size=4, dali_device="gpu")
    with pytest.raises(coordl.ConfigError, match="--backend 'tpu'"):
        ServeConfig(data="/d", batch_size=4, backend="tpu")
    with pytest.raises(coordl.ConfigError, match="--dali-device 'tpu'"):
        ServeConfig(data="/d", batch_size=4, backend="dali", dali_device="tpu")
    assert ServeConfig(data="/d", batch_size=4).backend == "cpu"  # the default
    monkeypatch.setitem(sys.modules, "nvidia", None)  # what Python does for a package not there
    with pytest.raises(coordl.ConfigError, match=r"not installed: pip install -e '\.\[dali\]'"):
        ServeConfig(data="/d", batch_size=4, backend="dali")
    monkeypatch.undo()
    from coordl.loader import dali as dali_loader

    if dali_loader.gpu_count() == 0:  # refused before the daemon starts, not batch after batch
        done = subprocess.run([COORDL, "serve", "--data", tiny_root, "--batch-size", "4", "--backend",
                               "dali", "--dali-device", "gpu", "--socket", os.path.join(sockdir, "g.sock")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "no CUDA device" in done.stderr
        assert "use --dali-device cpu" in done.stderr and not os.path.exists(os.path.join(sockdir, "g.sock"))
