"""`ProfileResult`: what `coordl.profile` returns; the text table and the PNG are in report.py."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from . import advice, stallmodel

CACHE_FRACTIONS = [k / 10 for k in range(11)]


@dataclass
class ProfileResult:
    """Measured rates, the stall split of an epoch, what-if predictions and (optionally) their check.

    Attributes:
        rates: measured training throughput, samples/s: ``ingestion`` (synthetic batches in
            memory), ``prep`` (every item cached in memory), ``fetch`` (the profiled run, reading
            storage cold except what its cache holds).
        fetch_stall_pct, prep_stall_pct, compute_pct: shares of the profiled run's epoch.
        epoch: seconds per epoch of the dataset: total, compute, prep_stall, fetch_stall.
        measured: the model's inputs and the other measurements (per worker count, bandwidths, CPU).
        what_if: predicted samples/s ``by_cache`` (fraction 0-1 of the dataset, at the profiled
            workers) and ``by_workers`` (at the profiled cache), ``smallest_cache`` and
            ``fewest_workers`` that remove the fetch and prep stall.
        validation: ``{config, predicted, measured, error_pct}`` per validated configuration.
        verdict: ``{"stall": "fetch" | "prep" | "none", "text"}``: which stall dominates the
            profiled run's epoch (advice.py).
        advice: what to change, each ``{"action", "text", "predicted", ...}`` from the model's
            predictions (a cache size, workers or cores, DALI on a GPU, the coordinator for k jobs).
        notes: why measured numbers that look contradictory are what they are.
        stall_bars: the epoch split, measured for the profiled run and predicted for it and for
            each advised configuration (``label``, ``kind``, seconds of compute, prep and fetch stall).
    """

    settings: dict
    rates: dict
    fetch_stall_pct: float
    prep_stall_pct: float
    compute_pct: float
    epoch: dict
    measured: dict
    what_if: dict
    validation: list = field(default_factory=list)
    verdict: dict = field(default_factory=dict)
    advice: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    stall_bars: list = field(default_factory=list)

    @classmethod
    def build(cls, settings, inputs: stallmodel.Inputs, ingest, alone, cold, cached, profiled, profiled_fraction,
              validation, rounds: dict | None = None, counts: list[int] | None = None) -> ProfileResult:
        W = settings["workers"]
        counts = counts or list(range(1, len(alone) + 1))  # the worker counts alone/cold/cached were timed at
        n = settings["items"]
        rates = {"ingestion": ingest.rate, "prep": cached[-1].rate, "fetch": profiled.rate}
        st = stallmodel.decompose(n, rates["ingestion"], rates["prep"], rates["fetch"])
        max_w = max(2 * W, inputs.cores + 2, 4)
        fewest = stallmodel.fewest_workers(inputs, 1.0, max_w)
        what_if = {
            "model": "rate(x, w) = min(ingestion, w / (t_item(w) + (1 - x) miss_cost(w)), "
                     "storage_bw(w) / ((1 - x) item_bytes), cores / (train_cpu + prep_cpu(w) + "
                     "(1 - x) fetch_cpu)): coordl/profiler/stallmodel.py",
            "by_cache": [{"cache_fraction": f, "cache_bytes": round(f * settings["dataset_bytes"]),
                          "workers": W, "predicted": r, "bound": stallmodel.limits(inputs, f, W).bound}
                         for f, r in stallmodel.what_if_cache(inputs, W, CACHE_FRACTIONS)],
            "by_workers": [{"workers": w, "cache_fraction": round(profiled_fraction, 4), "predicted": r,
                            "bound": stallmodel.limits(inputs, profiled_fraction, w).bound}
                           for w, r in stallmodel.what_if_workers(inputs, profiled_fraction,
                                                             list(range(1, max_w + 1)))],
            "by_workers_all_cached": [{"workers": w, "cache_fraction": 1.0, "predicted": r}
                                      for w, r in stallmodel.what_if_workers(inputs, 1.0, list(range(1, max_w + 1)))],
            "smallest_cache": _smallest_cache(inputs, W, settings["dataset_bytes"]),
            "fewest_workers": {
                "prep_stall": fewest,
                "best_at": stallmodel.plateau_workers(inputs, 1.0, max_w),
                "note": ("workers that bring the all-cached rate to the ingestion rate"
                         if fewest is not None else
                         f"no worker count up to {max_w} reaches the ingestion rate: "
                         f"{stallmodel.limits(inputs, 1.0, max_w).bound} bound"),
            },
        }
        measured = {
            "ingestion": _timed(ingest),
            "worker_counts_measured": list(counts),
            "worker_counts_fitted": [w for w in range(1, W + 1) if w not in counts],
            "prep_alone_by_workers": [dict(workers=w, **_timed(t)) for w, t in zip(counts, alone)],
            "prep_cold_by_workers": [dict(workers=w, **_timed(t)) for w, t in zip(counts, cold)],
            "miss_cost_by_workers": [inputs.miss_cost(w) for w in range(1, W + 1)],
            "miss_cost_in_place_by_workers": [inputs.miss_cost_in_place(w) for w in range(1, W + 1)],
            "train_cached_by_workers": [dict(workers=w, **_timed(t)) for w, t in zip(counts, cached)],
            "profiled": {"cache_fraction": round(profiled_fraction, 4), "workers": W, **_timed(profiled)},
            "storage_bw_by_readers": list(inputs.storage_bw),
            "memory_bw": inputs.memory_bw,
            "inputs": asdict(inputs),
            "predicted_profiled": stallmodel.predict(inputs, profiled_fraction, W),
            "predicted_all_cached": stallmodel.predict(inputs, 1.0, W),
        }
        for v in validation:
            v["error_pct"] = 100.0 * (v["predicted"] - v["measured"]) / v["measured"]
            v["within_tolerance"] = abs(v["error_pct"]) <= 100 * advice.CHECK_TOLERANCE
        device = settings.get("device", "cpu")
        found = advice.verdict(st.fetch_stall_pct, st.prep_stall_pct, st.compute_pct, device)
        pst = stallmodel.predicted_stalls(inputs, n, profiled_fraction, W)
        found = advice.reconcile(found, advice.verdict(pst.fetch_stall_pct, pst.prep_stall_pct, pst.compute_pct,
                                                       device))
        todo = advice.advise(inputs, found["stall"], W, profiled_fraction, settings["dataset_bytes"],
                             settings.get("device", "cpu"), max_w)
        rounds = rounds or {}
        explain = advice.notes(inputs, rates, list(inputs.cached), list(inputs.prep_cold), list(inputs.prep_alone),
                               W, profiled_fraction,
                               {"all cached": rounds.get(f"cached{W}", []), "profiled": rounds.get("profiled", [])},
                               measured_counts=counts)
        explain += advice.disagreement_notes(found, rates, stallmodel.predict(inputs, profiled_fraction, W),
                                             settings.get("steps", 0), settings.get("repeats", 1))
        explain += advice.validation_notes(validation, settings.get("steps", 0), settings.get("repeats", 1))
        return cls(settings, rates, st.fetch_stall_pct, st.prep_stall_pct, st.compute_pct,
                   {"total_s": st.epoch_s, "compute_s": st.compute_s, "prep_stall_s": st.prep_stall_s,
                    "fetch_stall_s": st.fetch_stall_s}, measured, what_if, validation, found, todo, explain,
                   _stall_bars(inputs, n, st, profiled_fraction, W, todo))

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self) -> str:
        from .report import table

        return table(self)

    def plot(self, path: str) -> str:
        """Write the what-if curves and the measured points as a PNG at `path` (matplotlib)."""
        from .report import plot

        return plot(self, path)

    def __str__(self) -> str:
        return self.table()


def _timed(t) -> dict:
    return {"samples_per_s": t.rate, "samples": t.samples, "seconds": t.seconds,
            "cpu_s_per_sample_main": t.cpu_self, "cpu_s_per_sample_workers": t.cpu_children,
            "cores_busy": t.cores_busy, "batches": t.batches,
            **({key: t.stats.get(key, 0) for key in ("storage_reads", "storage_bytes", "cache_hits", "decodes")}
               if t.stats else {})}


def _stall_bars(inputs: stallmodel.Inputs, n: int, measured: stallmodel.Stalls, x0: float, W: int,
                todo: list[dict]) -> list[dict]:
    """The measured epoch split of the profiled run, then the model's for it, for each advised
    cache size or worker count, and for everything cached."""
    def bar(label: str, kind: str, st: stallmodel.Stalls) -> dict:
        return {"label": label, "kind": kind, "compute_s": st.compute_s, "prep_stall_s": st.prep_stall_s,
                "fetch_stall_s": st.fetch_stall_s}

    bars = [bar(f"measured\n{x0:.0%} cached, {W}w", "measured", measured)]
    configs = [(x0, W)]
    for a in todo:
        if a["action"] == "cache":
            configs.append((a["cache_fraction"], W))
        elif a["action"] == "workers":
            configs.append((configs[-1][0] if len(configs) > 1 else x0, a["workers"]))
    configs.append((1.0, max(w for _x, w in configs)))
    seen = set()
    for x, w in configs:
        if (round(x, 4), w) not in seen:
            seen.add((round(x, 4), w))
            bars.append(bar(f"predicted\n{x:.0%} cached, {w}w", "predicted",
                            stallmodel.predicted_stalls(inputs, n, x, w)))
    return bars


def _smallest_cache(inputs: stallmodel.Inputs, workers: int, dataset_bytes: int) -> dict:
    f = stallmodel.smallest_cache(inputs, workers)
    return {"fetch_stall": f, "fetch_stall_bytes": round(f * dataset_bytes), "workers": workers,
            "note": "smallest cache (fraction of the dataset) within 2% of a full cache's rate"}
