"""coordl/profiler/stallmodel.py on synthetic rates: the stall split and the what-if model's limits."""

from __future__ import annotations

import pytest

from coordl.profiler import stallmodel

MB = 10**6


def inputs(**kw) -> stallmodel.Inputs:
    base = dict(ingestion=1000.0, train_cpu=0.0, prep_alone=(400.0, 800.0), cached=(400.0, 800.0),
                prep_cpu=(0.0, 0.0),
                storage_bw=(1000 * MB, 1000 * MB), memory_bw=10_000 * MB, fetch_cpu=0.0, read_latency=1e-12,
                item_bytes=100_000.0, cores=64)
    base.update(kw)
    return stallmodel.Inputs(**base)


# -- decomposition -------------------------------------------------------------------------

def test_model_bound_has_no_stall():
    st = stallmodel.decompose(1000, ingestion=100.0, prep=100.0, fetch=100.0)
    assert (st.epoch_s, st.compute_s, st.prep_stall_s, st.fetch_stall_s) == (10.0, 10.0, 0.0, 0.0)
    assert (st.compute_pct, st.prep_stall_pct, st.fetch_stall_pct) == (100.0, 0.0, 0.0)


def test_prep_bound_split():
    st = stallmodel.decompose(1000, ingestion=1000.0, prep=250.0, fetch=250.0)
    assert (st.compute_s, st.prep_stall_s, st.fetch_stall_s) == (1.0, 3.0, 0.0)
    assert st.prep_stall_pct == 75.0


def test_fetch_bound_split():
    st = stallmodel.decompose(1000, ingestion=1000.0, prep=500.0, fetch=100.0)
    assert (st.epoch_s, st.compute_s, st.prep_stall_s, st.fetch_stall_s) == (10.0, 1.0, 1.0, 8.0)
    assert (st.compute_pct, st.prep_stall_pct, st.fetch_stall_pct) == (10.0, 10.0, 80.0)


def test_noise_above_the_ingestion_rate_is_no_stall():
    # a cached or cold run measured a little faster than the synthetic one: no negative stall
    st = stallmodel.decompose(100, ingestion=100.0, prep=105.0, fetch=102.0)
    assert (st.prep_stall_s, st.fetch_stall_s) == (0.0, 0.0)


def test_decompose_rejects_zero_rates():
    with pytest.raises(ValueError):
        stallmodel.decompose(100, 0.0, 1.0, 1.0)


# -- what-if model -------------------------------------------------------------------------

def test_model_bound_prediction_is_the_ingestion_rate_everywhere():
    inp = inputs(ingestion=50.0)
    for x in (0.0, 0.5, 1.0):
        for w in (1, 2, 8):
            lim = stallmodel.limits(inp, x, w)
            assert lim.rate == 50.0 and lim.bound == "model"


def test_prep_bound_prediction_is_the_loader_alone_rate():
    # storage and memory effectively free: the loader delivers its all-cached rate at any cache size
    inp = inputs(storage_bw=(10**15, 10**15), memory_bw=10**15)
    assert stallmodel.predict(inp, 1.0, 1) == pytest.approx(400.0)
    assert stallmodel.predict(inp, 0.0, 2) == pytest.approx(800.0, rel=1e-6)
    assert stallmodel.limits(inp, 0.0, 2).bound == "workers"


def test_fetch_bound_prediction_follows_storage_bandwidth_and_cache():
    # 100 kB items, 10 MB/s storage (100 items/s), 1 ms a read, prep 0.1 ms per worker
    inp = inputs(ingestion=10_000.0, prep_alone=(10_000.0, 20_000.0), cached=(10_000.0, 10_000.0),
                 storage_bw=(10 * MB, 10 * MB), memory_bw=10**15, read_latency=0.001)
    for w in (1, 2, 8):
        assert stallmodel.predict(inp, 0.0, w) == pytest.approx(100.0)
        assert stallmodel.predict(inp, 0.5, w) == pytest.approx(200.0)
        assert stallmodel.predict(inp, 0.9, w) == pytest.approx(1000.0)
        assert stallmodel.limits(inp, 0.5, w).bound == "storage"
    assert stallmodel.predict(inp, 1.0, 2) == pytest.approx(10_000.0)  # all cached: model-bound again
    assert stallmodel.limits(inp, 1.0, 2).bound == "model"


def test_read_latency_bound_with_few_workers():
    # fast storage, 10 ms a read: each worker waits for its reads; more workers overlap them
    inp = inputs(ingestion=10_000.0, prep_alone=(10_000.0, 20_000.0), cached=(10_000.0, 10_000.0),
                 storage_bw=(10**15, 10**15), memory_bw=10**15, read_latency=0.01)
    assert stallmodel.predict(inp, 0.0, 1) == pytest.approx(1 / (1e-4 + 0.01))
    assert stallmodel.predict(inp, 0.5, 2) == pytest.approx(2 / (1e-4 + 0.005))
    assert stallmodel.predict(inp, 0.0, 4) == pytest.approx(4 / (1e-4 + 0.01))
    assert stallmodel.limits(inp, 0.0, 4).bound == "workers"


def test_miss_cost_is_measured_in_place():
    # the loader alone reads cold items at 320/s (1w) and 720/s (2w) against 400/s and 800/s cached:
    # a miss costs a worker 1/320 - 1/400 = 0.625 ms (1w) and 2/720 - 2/800 = 0.278 ms (2w), not the
    # 5 ms a read took on an idle storage
    inp = inputs(prep_cold=(320.0, 720.0), storage_bw=(10**15, 10**15), memory_bw=10**15,
                 read_latency=0.005)
    assert inp.miss_cost(1) == pytest.approx(0.000625)
    assert inp.miss_cost(2) == pytest.approx(2 / 720 - 2 / 800)
    assert inp.miss_cost(6) == inp.miss_cost(2)  # carried on above the measured workers
    assert inp.miss_cost_in_place(1) and inp.miss_cost_in_place(6)
    assert stallmodel.predict(inp, 0.0, 1) == pytest.approx(320.0)  # the cold loader's own rate back
    assert stallmodel.predict(inp, 0.5, 1) == pytest.approx(1 / (1 / 400 + 0.5 * 0.000625))
    assert stallmodel.predict(inp, 0.0, 2) == pytest.approx(720.0)
    assert stallmodel.limits(inp, 0.0, 2).bound == "workers"
    # without the cold runs: the idle read latency less a hit's copy
    idle = inputs(storage_bw=(10**15, 10**15), memory_bw=100 * MB, read_latency=0.005)
    assert idle.miss_cost(1) == pytest.approx(0.004) and not idle.miss_cost_in_place(1)


def test_a_cold_run_held_by_bandwidth_leaves_the_miss_to_the_storage_bound():
    # 10 MB/s storage (100 items/s): the cold loader ran at the storage's pace, so its in-place miss
    # cost (1/100 - 1/400 s) is queueing for bandwidth, which the storage bound already counts and
    # which shrinks with the cache; the miss costs a worker the idle read latency
    inp = inputs(prep_cold=(100.0, 100.0), storage_bw=(10 * MB, 10 * MB), memory_bw=10**15,
                 read_latency=0.001)
    assert inp.miss_cost(1) == pytest.approx(0.001) and inp.miss_cost(2) == pytest.approx(0.001)
    assert not inp.miss_cost_in_place(1) and not inp.miss_cost_in_place(2)
    assert stallmodel.predict(inp, 0.0, 1) == pytest.approx(100.0)
    assert stallmodel.predict(inp, 0.5, 2) == pytest.approx(200.0)
    assert stallmodel.limits(inp, 0.5, 2).bound == "storage"


def test_storage_bandwidth_is_at_least_what_the_cold_loader_got():
    # the threads measured 10 MB/s, the cold loader alone read 120 items/s of 100 kB (12 MB/s)
    inp = inputs(prep_cold=(120.0, 110.0), storage_bw=(10 * MB, 10 * MB), memory_bw=10**15,
                 read_latency=0.001)
    assert inp.storage_bandwidth(1) == pytest.approx(12 * MB)
    assert inp.storage_bandwidth(2) == pytest.approx(11 * MB) and inp.storage_bandwidth(5) == inp.storage_bandwidth(2)
    assert stallmodel.predict(inp, 0.5, 2) == pytest.approx(220.0)
    assert stallmodel.limits(inp, 0.5, 2).bound == "storage"
    assert inputs(storage_bw=(10 * MB, 10 * MB)).storage_bandwidth(1) == 10 * MB  # no cold runs


def test_cold_reads_cost_cpu():
    free = dict(storage_bw=(10**15, 10**15), memory_bw=10**15)
    inp = inputs(cores=2, train_cpu=0.001, prep_cpu=(0.002, 0.002), fetch_cpu=0.001, ingestion=5000.0,
                 prep_alone=(5000.0, 10000.0), cached=(5000.0, 5000.0), **free)
    assert stallmodel.limits(inp, 1.0, 2).cpu == pytest.approx(2 / 0.003)
    assert stallmodel.limits(inp, 0.0, 2).cpu == pytest.approx(2 / 0.004)
    assert stallmodel.predict(inp, 0.0, 2) == pytest.approx(500.0)


def test_worker_speed_is_the_training_pace_when_the_loader_binds():
    free = dict(storage_bw=(10**15, 10**15), memory_bw=10**15)
    # loader-bound (cached below ingestion): the workers' speed is what training got from them
    inp = inputs(prep_alone=(500.0, 1000.0), cached=(300.0, 600.0), **free)
    assert inp.worker_speed(1) == 300.0 and inp.worker_speed(2) == 300.0 and inp.worker_speed(5) == 300.0
    assert stallmodel.predict(inp, 1.0, 2) == pytest.approx(600.0)
    assert stallmodel.predict(inp, 1.0, 3) == pytest.approx(900.0)
    # model-bound at 2 workers (cached == ingestion): the loader had slack; its alone rate counts
    inp = inputs(ingestion=600.0, prep_alone=(500.0, 1000.0), cached=(300.0, 600.0), **free)
    assert inp.worker_speed(2) == 500.0 and inp.worker_speed(1) == 300.0
    assert stallmodel.predict(inp, 1.0, 2) == 600.0


def test_cpu_bound_when_step_and_prep_share_few_cores():
    # 2 cores, 1 ms of train CPU + 3 ms of loader CPU per sample: at most 500 samples/s
    inp = inputs(cores=2, train_cpu=0.001, prep_cpu=(0.003, 0.003), prep_alone=(400.0, 800.0))
    lim = stallmodel.limits(inp, 1.0, 2)
    assert lim.cpu == pytest.approx(500.0) and lim.rate == pytest.approx(500.0) and lim.bound == "cpu"
    assert stallmodel.predict(inp, 1.0, 1) == pytest.approx(400.0)


def test_more_workers_than_measured_carry_the_last_values():
    inp = inputs(storage_bw=(10**15, 10**15), memory_bw=10**15, cores=3, train_cpu=0.0,
                 prep_cpu=(0.0025, 0.0025))
    # per-worker speed of 2 workers (400/s each) carried on, until 3 cores / 2.5 ms = 1200/s binds
    assert stallmodel.predict(inp, 1.0, 3) == pytest.approx(1000.0, rel=1e-6)  # ingestion
    inp = inputs(ingestion=5000.0, storage_bw=(10**15, 10**15), memory_bw=10**15, cores=3,
                 prep_cpu=(0.0025, 0.0025))
    assert stallmodel.predict(inp, 1.0, 3) == pytest.approx(1200.0)
    assert stallmodel.predict(inp, 1.0, 4) == pytest.approx(1200.0)


def test_smallest_cache_and_fewest_workers():
    inp = inputs(ingestion=10_000.0, prep_alone=(10_000.0, 20_000.0), cached=(10_000.0, 10_000.0),
                 storage_bw=(10 * MB, 10 * MB), memory_bw=10**15)
    # the fetch stall only goes with (nearly) everything cached: within 2% of a full cache
    assert stallmodel.smallest_cache(inp, 2) == 0.99  # storage 100 / (1 - x) items/s reaches 9,800 at 0.99
    assert stallmodel.predict(inp, 0.98, 2) < 0.98 * stallmodel.predict(inp, 1.0, 2)
    # prep-bound: 400 per worker, ingestion 1000 -> 3 workers (carried per-worker speed 400/s)
    inp = inputs(storage_bw=(10**15, 10**15), memory_bw=10**15)
    assert stallmodel.fewest_workers(inp, 1.0, 8) == 3
    # CPU-bound before the ingestion rate: no worker count removes the prep stall
    inp = inputs(cores=1, prep_cpu=(0.002, 0.002), storage_bw=(10**15, 10**15), memory_bw=10**15)
    assert stallmodel.fewest_workers(inp, 1.0, 8) is None
    assert stallmodel.plateau_workers(inp, 1.0, 8) == 2  # 500/s (cores) from 2 workers on


def test_model_bound_needs_no_cache():
    inp = inputs(ingestion=10.0)
    assert stallmodel.smallest_cache(inp, 2) == 0.0
    assert stallmodel.fewest_workers(inp, 0.0, 4) == 1


@pytest.mark.parametrize("bad", [dict(ingestion=0.0), dict(prep_alone=(1.0,)), dict(cached=(1.0,)), dict(cores=0),
                                 dict(storage_bw=(0.0, 1.0)), dict(train_cpu=-1.0),
                                 dict(fetch_cpu=-1.0), dict(read_latency=0.0), dict(prep_cold=(1.0,)),
                                 dict(prep_cold=(0.0, 1.0))])
def test_inputs_are_checked(bad):
    with pytest.raises(ValueError):
        inputs(**bad)


def test_limits_checks_its_arguments():
    with pytest.raises(ValueError):
        stallmodel.limits(inputs(), 1.5, 2)
    with pytest.raises(ValueError):
        stallmodel.limits(inputs(), 0.5, 0)


# -- worker counts: a few timed, the rest fitted ---------------------------------------------

@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 8, 12, 16, 64, 256])
def test_a_few_worker_counts_are_timed_whatever_w(W):
    counts = stallmodel.measured_counts(W)
    assert counts[0] == 1 and counts[-1] == W and counts == sorted(set(counts))
    assert len(counts) <= stallmodel.MAX_MEASURED_COUNTS == 4
    assert len(counts) == min(W, 4)
    assert stallmodel.measured_counts(12) == [1, 2, 5, 12]


def test_fit_counts_keeps_the_measured_and_interpolates_the_rest():
    assert stallmodel.fit_counts([1], [7.0]) == (7.0,)
    fitted = stallmodel.fit_counts([1, 2, 5, 12], [100.0, 200.0, 440.0, 440.0])
    assert len(fitted) == 12
    assert fitted[0] == 100.0 and fitted[1] == 200.0 and fitted[4] == 440.0 and fitted[11] == 440.0
    assert fitted[2:4] == pytest.approx((280.0, 360.0)) and fitted[5:11] == pytest.approx((440.0,) * 6)
    for bad in (([2, 3], [1.0, 2.0]), ([1, 3], [1.0]), ([1, 3, 2], [1.0, 2.0, 3.0])):
        with pytest.raises(ValueError):
            stallmodel.fit_counts(*bad)
