"""coordl/profiler/advice.py on synthetic inputs: the verdict, advice derived from the model's
predictions (never fixed numbers), and the notes that explain contradictory-looking measurements."""

from __future__ import annotations

import math

import pytest

from coordl.profiler import advice, report, stallmodel

MB = 10**6


def inputs(**kw) -> stallmodel.Inputs:
    base = dict(ingestion=1000.0, train_cpu=0.0, prep_alone=(400.0, 800.0), cached=(400.0, 800.0),
                prep_cpu=(0.0, 0.0), storage_bw=(10**15, 10**15), memory_bw=10**15, fetch_cpu=0.0,
                read_latency=1e-4, item_bytes=100_000.0, cores=64)
    base.update(kw)
    return stallmodel.Inputs(**base)


def fetch_bound(bw: float = 10 * MB) -> stallmodel.Inputs:
    return inputs(ingestion=10_000.0, prep_alone=(10_000.0, 20_000.0), cached=(10_000.0, 10_000.0),
                  storage_bw=(bw, bw))


# -- verdict -------------------------------------------------------------------------------

@pytest.mark.parametrize("fetch, prep, device, stall, word", [
    (80.0, 10.0, "cpu", "fetch", "fetch-bound"),
    (5.0, 70.0, "cpu", "prep", "prep-bound"),
    (3.0, 4.0, "cpu", "none", "model-bound"),
    (3.0, 4.0, "cuda:0", "none", "GPU-bound"),
])
def test_verdict_names_the_dominant_stall(fetch, prep, device, stall, word):
    v = advice.verdict(fetch, prep, 100 - fetch - prep, device)
    assert v["stall"] == stall and v["text"].startswith(word)
    assert f"fetch stall {fetch:.0f}%" in v["text"]


# -- advice ---------------------------------------------------------------------------------

def test_fetch_bound_advice_is_the_models_smallest_cache():
    inp = fetch_bound()
    todo = advice.advise(inp, "fetch", 2, 0.0, 100 * MB, "cpu", 8)
    first = todo[0]
    assert first["action"] == "cache"
    assert first["cache_fraction"] == stallmodel.smallest_cache(inp, 2) == 0.99
    assert first["cache_bytes"] == round(0.99 * 100 * MB)
    assert first["predicted"] == pytest.approx(stallmodel.predict(inp, 0.99, 2))
    assert "--cache 95MiB" in first["text"]  # 99 MB = 94.4 MiB, rounded up
    # derived, not fixed: faster storage needs a smaller cache
    faster = advice.advise(fetch_bound(bw=500 * MB), "fetch", 2, 0.0, 100 * MB, "cpu", 8)[0]
    assert faster["action"] == "cache" and faster["cache_fraction"] < first["cache_fraction"]
    assert faster["cache_fraction"] == stallmodel.smallest_cache(fetch_bound(bw=500 * MB), 2)
    # a cache already that big: no cache advice
    assert all(a["action"] != "cache" for a in advice.advise(inp, "fetch", 2, 0.995, 100 * MB, "cpu", 8))


def test_prep_bound_advice_is_the_fewest_workers_that_reach_the_ingestion_rate():
    inp = inputs()  # 400/s a worker, ingestion 1000/s, free CPUs
    todo = advice.advise(inp, "prep", 2, 1.0, 100 * MB, "cpu", 8)
    w = next(a for a in todo if a["action"] == "workers")
    assert w["workers"] == stallmodel.fewest_workers(inp, 1.0, 8) == 3
    assert w["predicted"] == pytest.approx(1000.0)
    dali = next(a for a in todo if a["action"] == "dali")
    assert "on a machine with a GPU" in dali["text"] and 'dali_device="gpu"' in dali["text"]
    on_gpu = next(a for a in advice.advise(inp, "prep", 2, 1.0, 100 * MB, "cuda", 8) if a["action"] == "dali")
    assert "coordl serve --backend dali" in on_gpu["text"]


def test_cpu_bound_prep_advises_cores_dali_and_the_coordinator():
    # 2 cores, 1 ms train + 3 ms loader CPU a sample: 500/s at most, ingestion 1000/s
    inp = inputs(cores=2, train_cpu=0.001, prep_cpu=(0.003, 0.003))
    todo = advice.advise(inp, "prep", 2, 1.0, 100 * MB, "cpu", 8)
    actions = [a["action"] for a in todo]
    assert "cores" in actions and "dali" in actions and "coordinator" in actions
    cores = next(a for a in todo if a["action"] == "cores")
    assert cores["cores"] == math.ceil(1000.0 * 0.004) == 4
    dali = next(a for a in todo if a["action"] == "dali")
    assert dali["predicted_at_most"] == pytest.approx(1000.0)  # 2 cores / 1 ms of train CPU, capped by ingestion
    coord = next(a for a in todo if a["action"] == "coordinator")
    for row in coord["jobs"]:
        k = row["jobs"]
        assert row["predicted_shared"] == pytest.approx(advice.predict_jobs(inp, 1.0, 2, k, True))
        assert row["predicted_own"] == pytest.approx(2 / (k * 0.004))
        assert row["predicted_shared"] > row["predicted_own"]


def test_predict_jobs_shares_prep_once():
    inp = inputs(cores=2, train_cpu=0.001, prep_cpu=(0.003, 0.003))
    assert advice.predict_jobs(inp, 1.0, 2, 1, True) == pytest.approx(stallmodel.predict(inp, 1.0, 2))
    assert advice.predict_jobs(inp, 1.0, 2, 2, False) == pytest.approx(2 / 0.008)
    assert advice.predict_jobs(inp, 1.0, 2, 2, True) == pytest.approx(2 / 0.005)


def test_nothing_stalls_advises_fewer_workers_and_a_faster_step():
    inp = inputs(ingestion=300.0)  # one worker (400/s) keeps up with the model
    todo = advice.advise(inp, "none", 4, 0.0, 100 * MB, "cuda", 8)
    assert todo[0]["action"] == "workers" and todo[0]["workers"] == 1
    assert todo[-1]["action"] == "none"


# -- notes ----------------------------------------------------------------------------------

def test_notes_explain_a_cold_run_faster_than_a_cached_one():
    inp = inputs(prep_cold=(420.0, 850.0))
    rates = {"ingestion": 1000.0, "prep": 453.0, "fetch": 498.0}
    out = advice.notes(inp, rates, [400.0, 453.0], [420.0, 850.0], [400.0, 800.0], 2, 0.0,
                       {"all cached": [453.0, 430.0], "profiled": [498.0, 470.0]})
    text = "\n".join(out)
    assert "measured 498/s, faster than training with every item cached (453/s)" in text
    assert "run-to-run noise (rounds: all cached 430-453/s; profiled 470-498/s)" in text
    assert "A miss costs a worker 0.00 ms at 1w, 2w" in text and "not a missing value" in text


def test_notes_explain_a_prediction_far_from_the_measurement():
    inp = inputs(cores=2, train_cpu=0.001, prep_cpu=(0.002, 0.002), cached=(400.0, 1127.0),
                 prep_alone=(400.0, 1200.0), ingestion=1500.0)
    lim = stallmodel.limits(inp, 1.0, 2)
    assert lim.bound == "cpu" and lim.rate == pytest.approx(2 / 0.003)
    out = advice.notes(inp, {"ingestion": 1500.0, "prep": 1127.0, "fetch": 1127.0}, [400.0, 1127.0], [],
                       [400.0, 1200.0], 2, 1.0)
    text = "\n".join(out)
    assert "The model predicts 667/s with every item cached where 1127/s was measured" in text
    assert "cpu term binds" in text and "2 cores / 3.00 ms a sample" in text
    assert "ingestion rate (1500/s) is the train step alone" in text


def test_no_notes_when_nothing_contradicts():
    inp = inputs(prep_cold=(380.0, 780.0))
    rates = {"ingestion": 1000.0, "prep": 800.0, "fetch": stallmodel.predict(inp, 0.0, 2)}
    out = advice.notes(inp, rates, [400.0, 800.0], [380.0, 780.0], [400.0, 800.0], 2, 0.0)
    assert not [n for n in out if "faster than" in n or "0.00 ms" in n or "The model predicts" in n]


# -- the plot's scale ---------------------------------------------------------------------

def test_curves_are_scaled_to_the_data_not_the_ingestion_line():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([0, 100], [300.0, 450.0])
    report._scale_to_data(ax, 4000.0)  # far above: named, not drawn
    assert ax.get_ylim()[1] == pytest.approx(450 * 1.12)
    assert any("4,000/s, above the plot" in t.get_text() for t in ax.texts)
    fig2, ax2 = plt.subplots()
    ax2.plot([0, 100], [300.0, 450.0])
    report._scale_to_data(ax2, 500.0)  # near: drawn
    assert ax2.get_ylim()[1] == pytest.approx(500 * 1.12) and len(ax2.get_lines()) == 2
    plt.close(fig)
    plt.close(fig2)


# -- the verdict against the model; validations outside their tolerance ------------------------

def _timed(rate: float):
    from coordl.profiler.measure import Timed
    return Timed(samples=int(rate), seconds=1.0, cpu_self=0.0, cpu_children=0.0, stats={})


def _result(profiled: float, validation: list):
    from coordl.profiler.result import ProfileResult
    # a CPU run bound by its model: the loader alone is 10x faster than the step, storage is fast
    inp = inputs(ingestion=100.0, prep_alone=(1000.0,), cached=(100.0,), prep_cpu=(0.0,), storage_bw=(10**12,),
                 prep_cold=(1000.0,))
    settings = {"workers": 1, "items": 400, "dataset_bytes": 400 * 100_000, "device": "cpu", "steps": 2,
                "repeats": 1, "dataset": "DIR", "batch_size": 16, "cache_bytes": 0, "warmup_steps": 2}
    t = _timed
    r = ProfileResult.build(settings, inp, t(100.0), [t(1000.0)], [t(1000.0)], [t(100.0)], t(profiled),
                            0.0, validation)
    r.measured.update(cpu_cores_busy=1.0, max_rss_main_bytes=0, max_rss_worker_bytes=0)  # as run.py adds them
    return r


def test_a_measured_stall_the_model_does_not_predict_is_said_so():
    # the run: a fetch stall of 44% measured, every what-if row `model`, advice "none"
    r = _result(56.0, [])
    assert all(row["bound"] == "model" for row in r.what_if["by_cache"] + r.what_if["by_workers"])
    assert r.verdict["stall"] == "fetch" and r.verdict["predicted_stall"] == "none" and not r.verdict["agrees"]
    assert "the model, from the same measurements, predicts no stall" in r.verdict["text"]
    assert "the two disagree" in r.verdict["text"] and r.verdict["text"] in r.table()
    note = next(n for n in r.notes if n.startswith("The verdict from the measured split (fetch)"))
    assert "--repeats 3" in note and "more --steps" in note and "quieter machine" in note
    # agreeing: no such words
    ok = _result(100.0, [])
    assert ok.verdict["agrees"] and ok.verdict["stall"] == "none" and "disagree" not in ok.table()


def test_a_validation_outside_its_tolerance_is_flagged_with_what_to_change():
    r = _result(100.0, [{"config": {"cache_fraction": 0.5, "workers": 1}, "predicted": 136.8, "measured": 100.0},
                        {"config": {"cache_fraction": 0.0, "workers": 2}, "predicted": 105.0, "measured": 100.0}])
    bad, good = r.validation
    assert not bad["within_tolerance"] and good["within_tolerance"]
    flagged = [n for n in r.notes if n.startswith("VALIDATION OUTSIDE ITS TOLERANCE")]
    assert len(flagged) == 1 and "+36.8%, tolerance 15%" in flagged[0]
    assert "--steps" in flagged[0] and "--repeats 3" in flagged[0] and "quieter machine" in flagged[0]
    text = r.table()
    assert text.count("OUTSIDE +-15%") == 1 and "+36.8%  OUTSIDE" in text
