"""coordl.profile end to end on a real JPEG folder with real loader workers and MinIO segments.

Counts, not timings: which runs read storage and how much, which hit the cache, what the JSON
holds, and that nothing is left in the shared-memory folder (the autouse no_leaks check) on every exit path.
"""

from __future__ import annotations

import json

import pytest
import torch

import coordl
from coordl.errors import ConfigError
from coordl.profiler import ProfileResult, TrainStepError, profile


def tiny_step():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        x = batch[0][:, :, ::4, ::4].float() / 255
        loss = torch.nn.functional.cross_entropy(model(x), batch[1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step


@pytest.fixture
def ds(tiny_root):
    return coordl.ImageFolder(tiny_root, size=32)


def test_profile_measures_every_stage_and_validates(ds):
    r = profile(tiny_step(), ds, batch_size=4, num_workers=2, steps=2, validate=True, progress=False)
    assert isinstance(r, ProfileResult)
    d = json.loads(r.to_json())
    assert set(d["rates"]) == {"ingestion", "prep", "fetch"} and min(d["rates"].values()) > 0
    pct = d["fetch_stall_pct"] + d["prep_stall_pct"] + d["compute_pct"]
    assert pct == pytest.approx(100.0)
    m = d["measured"]
    need = (2 + 2) * 4
    # all-cached runs (loader alone and with the step, 1 and 2 workers) never read storage
    for run in m["prep_alone_by_workers"] + m["train_cached_by_workers"]:
        assert run["storage_reads"] == 0 and run["cache_hits"] == need
    assert [run["workers"] for run in m["train_cached_by_workers"]] == [1, 2]
    # the loader alone on cold items (the in-place miss cost) reads every item from storage
    for run in m["prep_cold_by_workers"]:
        assert run["storage_reads"] == need and run["cache_hits"] == 0
    assert [run["workers"] for run in m["prep_cold_by_workers"]] == [1, 2]
    assert len(m["miss_cost_by_workers"]) == 2 and min(m["miss_cost_by_workers"]) >= 0
    assert m["inputs"]["prep_cold"] == [run["samples_per_s"] for run in m["prep_cold_by_workers"]]
    # workers' CPU is read over the timed steps (from /proc), a finite share per sample
    for run in m["prep_alone_by_workers"] + m["prep_cold_by_workers"] + [m["profiled"]]:
        assert 0 <= run["cpu_s_per_sample_workers"] < 1
    # the profiled run (no cache) reads every item it uses from storage
    assert m["profiled"]["storage_reads"] == need and m["profiled"]["cache_hits"] == 0
    assert len(m["storage_bw_by_readers"]) == 2 and m["memory_bw"] > 0
    assert [row["cache_fraction"] for row in d["what_if"]["by_cache"]] == [k / 10 for k in range(11)]
    assert [row["workers"] for row in d["what_if"]["by_workers"]][:2] == [1, 2]
    assert {"smallest_cache", "fewest_workers"} <= set(d["what_if"])
    v = d["validation"]
    assert [c["config"]["workers"] for c in v] == [2, 1]
    assert v[0]["config"]["cache_fraction"] == pytest.approx(0.5, abs=0.1)
    assert v[1]["config"]["cache_fraction"] == 0.0
    for c in v:
        assert c["error_pct"] == pytest.approx(100 * (c["predicted"] - c["measured"]) / c["measured"])
    text = r.table()
    assert "fetch stall" in text and "validation" in text
    # a verdict and advice, in the JSON and in the text
    assert d["verdict"]["stall"] in ("fetch", "prep", "none") and d["verdict"]["text"] in text
    assert d["advice"] and all({"action", "text"} <= set(a) for a in d["advice"])
    assert all(a["text"][:40] in text.replace("\n  ", " ") for a in d["advice"])
    assert isinstance(d["notes"], list)
    # the stall bars: the measured split of the profiled run first, then the model's
    bars = d["stall_bars"]
    assert bars[0]["kind"] == "measured" and all(b["kind"] == "predicted" for b in bars[1:])
    assert bars[0]["prep_stall_s"] == pytest.approx(d["epoch"]["prep_stall_s"])
    assert bars[0]["fetch_stall_s"] == pytest.approx(d["epoch"]["fetch_stall_s"])


def test_profiled_cache_holds_its_share(ds):
    half = ds.manifest.total_bytes // 2
    r = profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=2, cache_bytes=half, progress=False)
    prof = r.measured["profiled"]
    x = prof["cache_fraction"]
    assert 0.3 < x < 0.7
    assert prof["cache_hits"] + prof["storage_reads"] == 16 and prof["cache_hits"] > 0
    assert r.settings["cache_bytes"] == half and "validation" in r.to_dict() and r.validation == []


def test_plot_writes_a_png(ds, tmp_path):
    pytest.importorskip("matplotlib")
    r = profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=1, validate=True, progress=False)
    path = r.plot(str(tmp_path / "p.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_train_step_that_raises_says_so(ds):
    def broken(batch):
        raise RuntimeError("shapes do not match")
    with pytest.raises(TrainStepError, match="raised RuntimeError: shapes do not match.*fix the model"):
        profile(broken, ds, batch_size=4, num_workers=1, steps=1, progress=False)


def test_a_train_step_failing_in_a_loader_run_leaves_no_cache(ds):
    calls = []

    def fails_later(batch):  # fine on the synthetic batches, fails once the loader feeds it
        calls.append(1)
        if len(calls) > 3:
            raise ValueError("bad batch")
        return torch.tensor(1.0)
    with pytest.raises(TrainStepError, match="bad batch"):
        profile(fails_later, ds, batch_size=4, num_workers=2, steps=1, progress=False)
    # no_leaks (autouse) checks that the all-items cache segment and the workers are gone


@pytest.mark.parametrize("returned", [None, "done", True, torch.empty(0)])
def test_a_train_step_returning_nothing_useful(ds, returned):
    with pytest.raises(TrainStepError, match="not its loss.*return"):
        profile(lambda batch: returned, ds, batch_size=4, num_workers=1, steps=1, progress=False)


def test_dataset_too_small_for_steps(ds):
    with pytest.raises(ConfigError, match=r"has 40 items; steps=20 with batch_size=4.*needs 88: pass steps <= 8"):
        profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=20, progress=False)
    with pytest.raises(ConfigError, match="smaller batch size"):
        profile(tiny_step(), ds, batch_size=30, num_workers=1, steps=1, progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu(ds):
    with pytest.raises(ConfigError, match="no CUDA GPU.*device='cpu'"):
        profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=1, device="cuda", progress=False)


def test_bad_arguments(ds):
    with pytest.raises(ConfigError, match="coordl.ImageFolder"):
        profile(tiny_step(), list(range(100)), batch_size=4, progress=False)
    with pytest.raises(ConfigError, match="num_workers=0"):
        profile(tiny_step(), ds, batch_size=4, num_workers=0, progress=False)
    with pytest.raises(ConfigError, match="cache_bytes=-1"):
        profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=1, cache_bytes=-1, progress=False)


def test_cpu_profile_never_synchronizes_cuda(ds, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("torch.cuda.synchronize called for a CPU device")
    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=1, progress=False)


def test_the_users_dataset_is_left_as_it_was(ds):
    profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=1, progress=False)
    assert ds.cache is None and ds.drop_page_cache is False


def test_repeats_keep_the_median_of_interleaved_rounds(ds):
    r = profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=1, repeats=3, validate=True,
                progress=False)
    rounds = r.measured["rounds"]
    assert set(rounds) == {"ingest", "alone1", "cold1", "cached1", "profiled", "validate0", "validate1"}
    assert all(len(v) == 3 for v in rounds.values())
    assert r.rates["prep"] == sorted(rounds["cached1"])[1]
    assert list(r.measured["inputs"]["prep_cold"]) == [sorted(rounds["cold1"])[1]]
    assert r.rates["fetch"] == sorted(rounds["profiled"])[1]
    assert r.validation[1]["measured"] == sorted(rounds["validate1"])[1]
    with pytest.raises(ConfigError, match="repeats=0"):
        profile(tiny_step(), ds, batch_size=4, num_workers=1, steps=1, repeats=0, progress=False)


def test_cores_busy_never_exceeds_the_cores(ds):
    # more workers than cores and few timed steps: the workers had decoded most items before the
    # timing began, which put the per-item CPU (and "cores busy", per-item CPU x rate) at 2.3 on 2 cores
    import os
    cores = len(os.sched_getaffinity(0))
    r = profile(tiny_step(), ds, batch_size=4, num_workers=4, steps=2, progress=False)
    m = r.measured
    runs = [m["profiled"], m["ingestion"], *m["prep_alone_by_workers"], *m["prep_cold_by_workers"],
            *m["train_cached_by_workers"]]
    for run in runs:  # a window of a few ms can read a tick too much: reported as the cores (measure.py)
        assert 0 < run["cores_busy"] <= cores, run
    assert 0 < m["cpu_cores_busy"] <= cores
    # the workers' CPU per item is read from the first batch on: never nan, never the whole-run fallback
    for run in runs[2:]:
        assert 0 < run["cpu_s_per_sample_workers"] < 0.05, run


def test_a_profile_times_a_few_worker_counts_and_fits_the_rest(ds):
    # W=5: timed at 1, 2, 3 and 5 workers, 4 fitted; the number of timed runs does not grow with W
    r = profile(tiny_step(), ds, batch_size=4, num_workers=5, steps=1, validate=True, progress=False)
    m = r.measured
    assert m["worker_counts_measured"] == [1, 2, 3, 5] and m["worker_counts_fitted"] == [4]
    assert set(m["rounds"]) == {"ingest", "profiled", "validate0", "validate1",
                                *(f"{k}{w}" for k in ("alone", "cold", "cached") for w in (1, 2, 3, 5))}
    for key in ("prep_alone_by_workers", "prep_cold_by_workers", "train_cached_by_workers"):
        assert [run["workers"] for run in m[key]] == [1, 2, 3, 5]
    inp = m["inputs"]
    for key in ("prep_alone", "cached", "prep_cold", "prep_cpu", "storage_bw"):
        assert len(inp[key]) == 5
        assert inp[key][3] == pytest.approx((inp[key][2] + inp[key][4]) / 2)  # 4 workers: fitted
    assert [run["samples_per_s"] for run in m["prep_cold_by_workers"]] == [inp["prep_cold"][w - 1]
                                                                          for w in (1, 2, 3, 5)]
    # the validation at W-1 = 4 workers checks a fitted count
    assert r.validation[1]["config"]["workers"] == 4
    assert "fitted between them" in r.table()
