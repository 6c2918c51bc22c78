"""The extension contract (issue 27 point 1): a user's coordl.CoordlDataset that writes only
__len__, fingerprint, read and prep gets counted stats, on_error, both caches, exact resume,
rank shares, per-(seed, epoch, item) randomness, coordl.profile and `coordl serve --dataset`.

The user dataset is the documentation's own example (docs/datasets.md, "Write your own dataset"),
taken from the page and imported as the module `contract_example`, so the documented code is what
is tested.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import pytest
import torch
from coordl_tests_loaderhelp import batches_of, epoch_counts

import coordl
from coordl.datasets.base import from_import_path

PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "datasets.md")
COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")
N = 64  # items in the example's tar


def documented_example() -> str:
    """The first python block of the section 'Write your own dataset' of docs/datasets.md."""
    with open(PAGE) as f:
        text = f.read()
    section = text[text.index("## Write your own dataset"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The documented example as the importable module `contract_example` (its folder on sys.path, so
    a `coordl serve` with that folder on PYTHONPATH imports the same class), and its tar of N images."""
    folder = tmp_path_factory.mktemp("contract")
    (folder / "contract_example.py").write_text(documented_example())
    spec = importlib.util.spec_from_file_location("contract_example", folder / "contract_example.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["contract_example"] = module
    spec.loader.exec_module(module)
    module.make_tar(str(folder / "images.tar"), items=N)
    module.folder, module.tar = str(folder), str(folder / "images.tar")
    yield module
    del sys.modules["contract_example"]




def _equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def _item_bytes(ds) -> int:
    return sum(size for _name, _offset, size in ds.items)


def test_the_documented_example_runs(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(documented_example())
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "images.tar")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["128", "128", "128"]  # what its comment says


@pytest.mark.parametrize("workers", [0, 2])
def test_stats_count_reads_bytes_decodes_and_samples(example, workers):
    ds = example.TarImages(example.tar)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers)
    for _ in range(2):
        got = epoch_counts(loader)
        assert got["storage_reads"] == N and got["storage_bytes"] == _item_bytes(ds)
        assert got["decodes"] == N and got["samples"] == N and got["errors_skipped"] == 0
    x, y = next(iter(loader))
    assert x.dtype == torch.uint8 and tuple(x.shape) == (8, 3, 16, 16) and y.dtype == torch.int64
    # the user's object is never bound or changed; ds[i] works unbound, uncounted
    assert ds.binding is None and torch.equal(ds[5][0], ds.prep(ds.read(5), 5, 0)[0]) and ds[5][1] == 1


def _broken(example, tmp_path):
    """A TarImages whose item 3 cannot be read (SampleError from read), item 7 is garbage (SampleError
    from prep) and item 11 raises OSError in read (turned into a SampleError)."""
    path = str(tmp_path / "broken.tar")
    example.make_tar(path, items=16)
    with tarfile.open(path, "a") as tar:  # a 17th member that is not an .npy image
        info = tarfile.TarInfo("2_bad.npy")
        info.size = 9
        tar.addfile(info, io.BytesIO(b"not numpy"))

    class Broken(example.TarImages):
        def read(self, i):
            if i == 3:
                raise coordl.SampleError(f"{self.path}: item 3 is gone")
            if i == 11:
                raise OSError(5, "Input/output error")
            return super().read(i)

    return Broken, path


@pytest.mark.parametrize("workers", [0, 2])
def test_sample_errors_in_read_and_prep_are_skipped_and_counted(example, tmp_path, workers):
    Broken, path = _broken(example, tmp_path)
    loader = coordl.DataLoader(Broken(path, on_error="skip"), batch_size=4, num_workers=workers)
    batches = list(loader)
    assert [len(b[1]) if b else 0 for b in batches] == [3, 4, 3, 4, 0]  # the last batch: item 16 alone, skipped
    got = loader.stats()
    assert got["errors_skipped"] == 3 and got["samples"] == 17 - 3
    assert got["storage_reads"] == 17 - 2 and got["decodes"] == 17 - 2  # items 3 and 11 never read


def test_sample_errors_raise_naming_the_item(example, tmp_path):
    Broken, path = _broken(example, tmp_path)
    ds = Broken(path)
    with pytest.raises(coordl.SampleError, match="item 3 is gone"):
        list(coordl.DataLoader(ds, batch_size=4))
    with pytest.raises(coordl.SampleError, match=r"Broken item 11: cannot read it .*Input/output error"):
        list(coordl.DataLoader(ds, batch_size=4, sampler=[11]))
    with pytest.raises(coordl.SampleError, match="2_bad.npy: not a .npy image"):
        list(coordl.DataLoader(ds, batch_size=4, sampler=[16]))


def test_half_size_minio_cache_exact_hits_in_epoch_two_with_two_workers(example, dropped):
    ds = example.TarImages(example.tar)
    total = _item_bytes(ds)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, cache=total // 2)
    dropped.append(loader.dataset)
    first = epoch_counts(loader)
    assert first["cache_misses"] == N and first["cache_hits"] == 0 and first["storage_reads"] == N
    items = loader.stats()["cache_items"]
    assert 0 < items < N and first["cache_inserts"] == items
    for _ in range(2):
        later = epoch_counts(loader)
        assert later["cache_hits"] == items and later["cache_misses"] == N - items
        assert later["storage_reads"] == N - items and later["cache_inserts"] == 0 and later["samples"] == N


def test_partitioned_cache_serves_epoch_two(example, redis_nodes):
    node = redis_nodes()
    loader = coordl.DataLoader(example.TarImages(example.tar), batch_size=8, shuffle=True, num_workers=2,
                               cache=coordl.PartitionedCache([node.url], 0))
    first = epoch_counts(loader)
    assert first["storage_reads"] == N and first["samples"] == N
    second = epoch_counts(loader)
    assert second["storage_reads"] == 0 and second["local_hits"] + second["remote_hits"] == N


def test_cache_without_a_fingerprint_is_a_config_error_naming_it(example):
    class NoFingerprint(coordl.CoordlDataset):
        def __len__(self):
            return 4

        def read(self, i):
            return bytes([i])

        def prep(self, raw, i, epoch):
            return torch.tensor(raw[0])

    with pytest.raises(coordl.ConfigError, match=r"cache= needs the dataset's `fingerprint`.*NoFingerprint has "
                                                 r"no `fingerprint` property: define `@property def fingerprint"):
        coordl.DataLoader(NoFingerprint(), batch_size=2, cache="1MiB")
    # without cache= it loads (resume and stats need no fingerprint)
    loader = coordl.DataLoader(NoFingerprint(), batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]] and loader.stats()["storage_reads"] == 4


def test_a_subclass_without_read_or_prep_is_refused_by_name():
    class NoRead(coordl.CoordlDataset):
        def __len__(self):
            return 2

        def prep(self, raw, i, epoch):
            return raw

    with pytest.raises(coordl.ConfigError, match="NoRead does not define `read`"):
        coordl.DataLoader(NoRead(), batch_size=2)


def test_resume_mid_epoch_is_exact(example):
    def build():
        return coordl.DataLoader(example.TarImages(example.tar, seed=3), batch_size=8, shuffle=True, num_workers=2)

    ref = batches_of(build()) + batches_of(build_at(build(), 1))
    loader = build()
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    again = build()
    again.load_state_dict(state)
    rest = batches_of(again)
    assert len(rest) == N // 8 - 3 and _equal(rest, ref[3:N // 8])
    assert _equal(batches_of(again), ref[N // 8:])  # and the next epoch as an uninterrupted run's
    assert again.stats()["storage_reads"] == N - 3 * 8 + N  # the received batches are not read again


def build_at(loader, epoch: int):
    loader.set_epoch(epoch)
    return loader


def test_rank_shares_are_disjoint_and_cover(example):
    ds = example.TarImages(example.tar)
    seen = []
    for rank in (0, 1):
        loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, rank=rank, world_size=2, num_workers=2 * rank)
        labels = [v for _, y in loader for v in y.tolist()]
        seen.append(loader.epoch_indices(0))
        assert labels == [int(ds.items[i][0].split("_")[0]) for i in seen[-1]]
        assert loader.stats()["storage_reads"] == len(seen[-1]) == N // 2
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(N))


def test_randomness_is_per_seed_epoch_item_whatever_the_workers(example):
    ds = example.TarImages(example.tar, seed=7)
    runs = {}
    for workers in (0, 2):
        loader = coordl.DataLoader(ds, batch_size=8, shuffle=False, num_workers=workers)
        runs[workers] = [batches_of(loader) for _ in range(2)]
    assert _equal(runs[0][0], runs[2][0]) and _equal(runs[0][1], runs[2][1])
    epoch0, epoch1 = (torch.cat([x for x, _ in run]) for run in runs[0])
    flipped = [not torch.equal(a, b) for a, b in zip(epoch0, epoch1)]
    assert 0 < sum(flipped) < N  # other flips in epoch 1, item for item (no flip is the same image)
    assert ds.rng(5, 1).random() == ds.rng(5, 1).random() != ds.rng(5, 2).random()
    assert ds.np_rng(5, 1).integers(1 << 30) == ds.np_rng(5, 1).integers(1 << 30)
    assert example.TarImages(example.tar, seed=8).rng(5, 1).random() != ds.rng(5, 1).random()


def test_coordl_profile_runs_on_it(example):
    ds = example.TarImages(example.tar)

    def train_step(batch):
        x, y = batch
        return float(x.float().mean())

    result = coordl.profile(train_step, ds, batch_size=4, num_workers=1, steps=2, progress=False)
    got = result.to_dict() if hasattr(result, "to_dict") else vars(result)
    text = json.dumps(got, default=str)
    assert '"items": 64' in text and "TarImages" in text


def test_serve_refuses_a_bad_dataset_path_by_name(example):
    with pytest.raises(coordl.ConfigError, match="cannot import 'no_such_module'"):
        from_import_path("no_such_module:X", None, 0, "raise")
    with pytest.raises(coordl.ConfigError, match="name the class as module:Class"):
        from_import_path("contract_example", None, 0, "raise")
    with pytest.raises(coordl.ConfigError, match="make_tar in contract_example is function, not a coordl"):
        from_import_path("contract_example:make_tar", None, 0, "raise")
    with pytest.raises(coordl.ConfigError, match="seed=3 but the daemon's --seed is 0"):
        from_import_path("contract_example:TarImages", {"path": example.tar, "seed": 3}, 0, "raise")
    with pytest.raises(coordl.ConfigError, match=r"TarImages\(\*\*args\) failed"):
        from_import_path("contract_example:TarImages", {"root": example.tar}, 0, "raise")
    ds = from_import_path("contract_example:TarImages", {"path": example.tar}, 4, "skip")
    assert (ds.seed, ds.on_error, len(ds)) == (4, "skip", N)


@pytest.fixture
def sockdir():
    """A short private folder for the daemon's socket (also puts this file's daemon test in the slow tier,
    as tests/conftest.py assigns tiers by this fixture's name)."""
    path = tempfile.mkdtemp(prefix="cdl-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _serve(example, sockdir, *flags) -> tuple[subprocess.Popen, str]:
    """`coordl serve --dataset contract_example:TarImages` over the example's tar (the module on the
    daemon's PYTHONPATH), listening on a socket in `sockdir`."""
    sock = os.path.join(sockdir, "s.sock")
    env = {**os.environ, "PYTHONPATH": example.folder + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [COORDL, "serve", "--dataset", "contract_example:TarImages", "--dataset-args",
            json.dumps({"path": example.tar}), "--batch-size", "8", "--socket", sock, "--join-window", "0",
            *flags]
    with open(os.path.join(sockdir, "err"), "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if "listening" not in line:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        pytest.fail(f"coordl serve --dataset did not start: {line!r} " + open(os.path.join(sockdir, "err")).read())
    return proc, "unix://" + sock


def _stop(proc: subprocess.Popen, sockdir: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    proc.stdout.close()
    assert code == 0, open(os.path.join(sockdir, "err")).read()


def test_coordl_serve_dataset_serves_the_user_class_to_a_job(example, sockdir):
    from coordl.coordinator.client import status

    proc, address = _serve(example, sockdir, "--size", "16", "--seed", "5", "--workers", "2")
    try:
        ds = example.TarImages(example.tar, seed=5)
        local = coordl.DataLoader(ds, batch_size=8, shuffle=True)
        job = coordl.DataLoader(ds, batch_size=8, shuffle=True, coordinator=address)
        for _ in range(2):  # the daemon's batches are the local loader's, epoch for epoch
            assert _equal(batches_of(job), batches_of(local))
        st = status(address[len("unix://"):])
        assert st["transform"] == "contract_example:TarImages" and st["items"] == N
        assert 2 * N <= st["decodes"] <= 3 * N  # two epochs, and what the ring holds ahead (8 slots of 8)
        with pytest.raises(coordl.CoordinatorError, match=r"seed=6 \(job\) != the daemon's seed=5"):
            coordl.DataLoader(example.TarImages(example.tar, seed=6), batch_size=8, shuffle=True,
                              coordinator=address)
        del job
    finally:
        _stop(proc, sockdir)


def test_serve_refuses_samples_the_ring_cannot_hold(example, sockdir):
    """prep returning another shape than --size: the job's batch fails with a message naming it."""
    proc, address = _serve(example, sockdir, "--size", "32", "--workers", "1")
    try:
        job = coordl.DataLoader(example.TarImages(example.tar), batch_size=8, shuffle=True, coordinator=address)
        with pytest.raises(coordl.CoordlError, match=r"prep\(\d+\) returned \(Tensor \(3, 16, 16\).*coordl serve "
                                                     r"--size 32"):
            next(iter(job))
        del job
    finally:
        _stop(proc, sockdir)


def test_np_rng_is_a_numpy_generator(example):
    assert isinstance(example.TarImages(example.tar).np_rng(0, 0), np.random.Generator)


def test_serve_config_takes_one_of_data_and_dataset(tmp_path):
    from coordl.coordinator.config import ServeConfig

    sock = str(tmp_path / "s.sock")
    with pytest.raises(coordl.ConfigError, match="one of --data DIR .* or --dataset pkg.mod:Class .*got neither"):
        ServeConfig(data="", batch_size=4, socket=sock)
    with pytest.raises(coordl.ConfigError, match="got both"):
        ServeConfig(data="/x", dataset="m:C", batch_size=4, socket=sock)
    with pytest.raises(coordl.ConfigError, match="--dataset-args must be a JSON object, and goes with --dataset"):
        ServeConfig(data="/x", dataset_args={"a": 1}, batch_size=4, socket=sock)
    assert ServeConfig(data="", dataset="m:C", dataset_args={"a": 1}, batch_size=4, socket=sock).dataset == "m:C"


# -- read_many: a batch's misses read together (one call per batch, the misses only) --

def _batched(example, log: str):
    """A TarImages whose read_many reads a batch's misses together (one open file, preads in offset
    order) and appends the items of each call to `log` (one JSON line per call, from any process)."""

    class Batched(example.TarImages):
        def read(self, i):
            raise AssertionError("read_many reads every miss: read(i) is not called for a batch")

        def read_many(self, items):
            with open(log, "a") as f:
                f.write(json.dumps(items) + "\n")
            out = {}
            with open(self.path, "rb") as f:
                for i in sorted(items, key=lambda i: self.items[i][1]):
                    _name, offset, size = self.items[i]
                    out[i] = os.pread(f.fileno(), size, offset)
            return out

    return Batched


def _calls(log: str) -> list[list[int]]:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        calls = [json.loads(line) for line in f]
    os.unlink(log)
    return calls


def _chunks(order: list[int], size: int) -> list[set[int]]:
    return [set(order[k:k + size]) for k in range(0, len(order), size)]


@pytest.mark.parametrize("workers", [0, 2])
def test_read_many_gets_one_call_per_batch_with_its_items_and_counts_exact(example, tmp_path, workers):
    log = str(tmp_path / "calls")
    ds = _batched(example, log)(example.tar)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers)
    for epoch in range(2):
        got = epoch_counts(loader)
        calls = _calls(log)
        assert sorted(map(sorted, calls)) == sorted(map(sorted, _chunks(loader.epoch_indices(epoch), 8)))
        assert all(len(c) == len(set(c)) == 8 for c in calls)  # each batch's items once, in one call
        assert got["storage_reads"] == N and got["storage_bytes"] == _item_bytes(ds)
        assert got["decodes"] == N and got["samples"] == N and got["errors_skipped"] == 0


def test_read_many_with_a_half_size_minio_cache_gets_only_the_uncached_items(example, tmp_path, dropped):
    log = str(tmp_path / "calls")
    ds = _batched(example, log)(example.tar)
    total = _item_bytes(ds)
    loader = coordl.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, cache=total // 2)
    dropped.append(loader.dataset)
    first = epoch_counts(loader)
    assert len(_calls(log)) == N // 8 and first["storage_reads"] == N
    cache = loader.dataset.cache
    cached = {i for i in range(N) if cache.get(i) is not None}
    assert 0 < len(cached) < N and loader.stats()["cache_items"] == len(cached)
    for epoch in (1, 2):
        got = epoch_counts(loader)
        calls = [set(c) for c in _calls(log)]
        batches = [b - cached for b in _chunks(loader.epoch_indices(epoch), 8)]
        assert sorted(map(sorted, calls)) == sorted(sorted(b) for b in batches if b)  # one call per batch with
        assert got["cache_hits"] == len(cached) and got["cache_misses"] == N - len(cached)  # misses, only them
        assert got["storage_reads"] == N - len(cached) and got["samples"] == N
        assert got["storage_bytes"] == sum(ds.items[i][2] for i in range(N) if i not in cached)


def _failing(example, path: str):
    """read_many giving item 3 a SampleError and item 11 an OSError as their values; item 16 is garbage."""

    class Failing(example.TarImages):
        def read_many(self, items):
            out = {i: super(Failing, self).read(i) for i in items if i not in (3, 11)}
            if 3 in items:
                out[3] = coordl.SampleError(f"{self.path}: item 3 is gone")
            if 11 in items:
                out[11] = OSError(5, "Input/output error")
            return out

    return Failing


@pytest.mark.parametrize("workers", [0, 2])
def test_read_many_exception_values_are_skipped_and_counted(example, tmp_path, workers):
    _, path = _broken(example, tmp_path)
    loader = coordl.DataLoader(_failing(example, path)(path, on_error="skip"), batch_size=4, num_workers=workers)
    batches = list(loader)
    assert [len(b[1]) if b else 0 for b in batches] == [3, 4, 3, 4, 0]
    got = loader.stats()
    assert got["errors_skipped"] == 3 and got["samples"] == 17 - 3
    assert got["storage_reads"] == 17 - 2 and got["decodes"] == 17 - 2  # items 3 and 11 not read


def test_read_many_exception_values_raise_naming_the_item(example, tmp_path):
    _, path = _broken(example, tmp_path)
    ds = _failing(example, path)(path)
    with pytest.raises(coordl.SampleError, match="item 3 is gone"):
        list(coordl.DataLoader(ds, batch_size=4))
    with pytest.raises(coordl.SampleError, match=r"Failing item 11: cannot read it .*Input/output error") as info:
        list(coordl.DataLoader(ds, batch_size=4, sampler=[8, 9, 10, 11]))
    assert isinstance(info.value.__cause__, OSError)
    del info


def test_read_many_that_forgets_an_item_or_gives_no_bytes_is_a_config_error(example):
    class Forgets(example.TarImages):
        def read_many(self, items):
            return {i: super(Forgets, self).read(i) for i in items[1:]}

    class Text(example.TarImages):
        def read_many(self, items):
            return {i: "text" for i in items}

    with pytest.raises(coordl.ConfigError, match=r"Forgets.read_many\(\[0, 1\]\) returned a dict without items "
                                                 r"\[0\]: it must return \{item: bytes"):
        list(coordl.DataLoader(Forgets(example.tar), batch_size=2, sampler=[0, 1]))
    with pytest.raises(coordl.ConfigError, match="Text.read_many gave str for item 0: it must give the item's "
                                                 "encoded bytes"):
        list(coordl.DataLoader(Text(example.tar), batch_size=2, sampler=[0, 1]))


def test_the_default_read_many_calls_read_for_each_item(example):
    ds = example.TarImages(example.tar)
    assert ds.read_many([4, 2]) == {4: ds.read(4), 2: ds.read(2)}


def test_a_dataset_without_a_repr_is_named_by_its_class_and_arguments(example):
    """What `coordl status` and a coordinator's refusal show for a user's dataset (was
    '<contract_example.TarImages object at 0x...>')."""
    ds = example.TarImages(example.tar, seed=3)
    assert ds.served_as()[0] == f"contract_example:TarImages(path={example.tar!r}, seed=3, on_error='raise')"
