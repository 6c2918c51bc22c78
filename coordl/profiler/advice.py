"""The profile's verdict and advice, and the notes that explain what looks contradictory. Pure.

Planning, not measuring: every number here comes from the measured stall split
(stallmodel.decompose) or from the what-if model (stallmodel.predict and friends), so
the advice moves with the measurements and is tested on synthetic inputs.

- `verdict`: which stall dominates the profiled run's epoch: ``fetch``
  (storage), ``prep`` (decode and augmentation) or ``none`` (GPU- or
  model-bound). A stall under STALL_FLOOR percent of the epoch is none.
- `advise`: what to change, each with the model's predicted rate: a cache size
  (stallmodel.smallest_cache), a number of workers (stallmodel.fewest_workers) or cores
  (the CPU term at the ingestion rate), decode on the GPU (DALI) when prep binds,
  the coordinator (``coordl serve``) for k jobs on the same dataset
  (`predict_jobs`), or fewer workers when nothing stalls.
- `notes`: measured rates that look contradictory (a cold run faster than a
  cached one; a miss that costs 0 ms; a prediction far from a measurement) and
  why.
"""

from __future__ import annotations

import math

from coordl.cache.sizes import fmt_mib

from . import stallmodel

STALL_FLOOR = 10.0   # % of the epoch: a smaller stall is noise on a short profile, "none"
CHECK_TOLERANCE = 0.15  # a model check further off than this gets a note
JOBS = (2, 4)        # job counts the coordinator advice is priced at
GAIN = 0.10          # advice that the model predicts gains less than this is left out
MiB = 2**20


def verdict(fetch_pct: float, prep_pct: float, compute_pct: float, device: str) -> dict:
    """{"stall": "fetch" | "prep" | "none", "text": ...} from the profiled run's epoch split."""
    split = f"fetch stall {fetch_pct:.0f}%, prep stall {prep_pct:.0f}%, compute {compute_pct:.0f}% of the epoch"
    if max(fetch_pct, prep_pct) < STALL_FLOOR:
        who = "GPU-bound" if device.startswith("cuda") else "model-bound"
        return {"stall": "none", "text": f"{who}: the data pipeline keeps up ({split})"}
    if fetch_pct >= prep_pct:
        return {"stall": "fetch", "text": f"fetch-bound: training waits on storage ({split})"}
    return {"stall": "prep", "text": f"prep-bound: training waits on decode and augmentation ({split})"}


def reconcile(measured: dict, predicted: dict) -> dict:
    """The verdict from the measured split, with the one the model predicts for the same run
    (`predicted_stall`) and whether they agree; where they do not, the text says so, as the
    advice follows the measured one while every what-if row follows the model."""
    out = {**measured, "predicted_stall": predicted["stall"], "agrees": measured["stall"] == predicted["stall"]}
    if not out["agrees"]:
        what = {"none": "no stall", "fetch": "a fetch stall", "prep": "a prep stall"}[predicted["stall"]]
        out["text"] = (f"{measured['text']}; but the model, from the same measurements, predicts {what} "
                       f"for this run ({predicted['text'].split('(', 1)[1]}: the two disagree (see notes)")
    return out


def disagreement_notes(found: dict, rates: dict, predicted: float, steps: int, repeats: int) -> list[str]:
    """Why the measured verdict and the model's differ, and what to change (empty when they agree)."""
    if found.get("agrees", True):
        return []
    return [f"The verdict from the measured split ({found['stall']}) and the model's ({found['predicted_stall']}) "
            f"disagree: the profiled run measured {rates['fetch']:.0f}/s where the model predicts {predicted:.0f}/s "
            f"from the other runs (ingestion {rates['ingestion']:.0f}/s, all cached {rates['prep']:.0f}/s). The "
            f"split compares single short runs ({steps} timed steps, {repeats} round{'s' if repeats > 1 else ''}), "
            "so one run slowed by the machine (other work, a worker starting) reads as a stall the model does not "
            "see; the what-if rows and the advice follow the model. Measure again with more --steps (13 or more) "
            "and --repeats 3, on a quieter machine, before acting on either."]


def validation_notes(validation: list[dict], steps: int, repeats: int) -> list[str]:
    """A note per validated configuration whose prediction is off by more than CHECK_TOLERANCE."""
    out = []
    for v in validation:
        if v.get("within_tolerance", True):
            continue
        c = v["config"]
        out.append(f"VALIDATION OUTSIDE ITS TOLERANCE: at {c['cache_fraction']:.0%} cached, {c['workers']} workers "
                   f"the model predicted {v['predicted']:.1f}/s and {v['measured']:.1f}/s was measured "
                   f"({v['error_pct']:+.1f}%, tolerance {CHECK_TOLERANCE:.0%}): the predictions of this profile "
                   f"are not checked to {CHECK_TOLERANCE:.0%}. Short, noisy runs are the usual cause ({steps} timed "
                   f"steps, {repeats} round{'s' if repeats > 1 else ''}): pass more --steps (13 or more, with "
                   "images enough for them), --repeats 3, and profile on a quieter machine.")
    return out


def cpu_per_sample(inp: stallmodel.Inputs, cache_fraction: float, workers: int) -> float:
    """CPU seconds one sample costs, train step, loader and its cold read together (the model's CPU term)."""
    return inp.train_cpu + inp.at(inp.prep_cpu, workers) + (1.0 - cache_fraction) * inp.fetch_cpu


def predict_jobs(inp: stallmodel.Inputs, cache_fraction: float, workers: int, jobs: int, shared: bool) -> float:
    """Predicted samples/s of each of `jobs` jobs training on this dataset at once on this machine:
    each with its own loader (`shared` False: k loaders share the cores and the storage) or fed by
    the coordinator (True: each batch fetched and prepared once for all k)."""
    lim = stallmodel.limits(inp, cache_fraction, workers)
    miss = 1.0 - cache_fraction
    prep = inp.at(inp.prep_cpu, workers) + miss * inp.fetch_cpu
    cpu_per_round = jobs * inp.train_cpu + (prep if shared else jobs * prep)
    cpu = inp.cores / cpu_per_round if cpu_per_round > 0 else math.inf
    storage = lim.storage if shared else lim.storage / jobs
    return min(lim.ingestion, lim.workers, storage, cpu)


def advise(inp: stallmodel.Inputs, stall: str, workers: int, cache_fraction: float, dataset_bytes: int,
           device: str, max_workers: int) -> list[dict]:
    """What to change, most useful first: ``{"action", "text", "predicted", ...}`` per item."""
    now = stallmodel.predict(inp, cache_fraction, workers)
    out: list[dict] = []
    if stall == "fetch":
        out += _cache_advice(inp, workers, cache_fraction, dataset_bytes, now)
    x = max(cache_fraction, out[0]["cache_fraction"]) if out else cache_fraction
    if stall in ("fetch", "prep"):
        out += _worker_advice(inp, workers, x, max_workers, stallmodel.predict(inp, x, workers))
        if stall == "prep":
            out.append(_dali_advice(inp, workers, x, device))
        out += _coordinator_advice(inp, workers, x)
    else:
        fewest = stallmodel.fewest_workers(inp, cache_fraction, max_workers)
        if fewest is not None and fewest < workers:
            predicted = stallmodel.predict(inp, cache_fraction, fewest)
            out.append({"action": "workers", "workers": fewest, "predicted": predicted,
                        "short": f"{fewest} workers suffice",
                        "text": f"{fewest} worker{'s' if fewest > 1 else ''} would keep up (predicted "
                                f"{predicted:.0f}/s, as now): the other "
                                f"{workers - fewest} only take cores and memory"})
        out.append({"action": "none", "predicted": now, "short": "a faster model step",
                    "text": "no cache or worker change helps: a faster model step (a bigger GPU, mixed "
                            f"precision, a larger batch) is what raises the {now:.0f}/s"})
    return out


def _cache_advice(inp, workers, x0, dataset_bytes, now) -> list[dict]:
    x = stallmodel.smallest_cache(inp, workers)
    if x <= x0:
        return []
    size = x * dataset_bytes
    pred = stallmodel.predict(inp, x, workers)
    return [{"action": "cache", "cache_fraction": x, "cache_bytes": round(size), "predicted": pred,
             "short": f"cache {_size(size, flag=True)} ({pred:.0f}/s)",
             "text": f"a cache of {_size(size)} ({x:.0%} of the dataset; --cache {_size(size, flag=True)}, "
                     f"DataLoader(..., cache=\"{_size(size, flag=True)}\")): predicted {pred:.0f}/s against "
                     f"{now:.0f}/s now; a bigger one adds under {stallmodel.TOLERANCE:.0%}"}]


def _worker_advice(inp, workers, x, max_workers, now) -> list[dict]:
    fewest = stallmodel.fewest_workers(inp, x, max_workers)
    if fewest is not None:
        if fewest <= workers:
            return []
        pred = stallmodel.predict(inp, x, fewest)
        return [{"action": "workers", "workers": fewest, "predicted": pred, "short": f"{fewest} workers ({pred:.0f}/s)",
                 "text": f"{fewest} workers (now {workers}): predicted {pred:.0f}/s, the ingestion rate "
                         f"(no prep stall left) against {now:.0f}/s"}]
    best_w = stallmodel.plateau_workers(inp, x, max_workers)
    best = stallmodel.predict(inp, x, best_w)
    out = []
    if best_w != workers and best > (1 + GAIN) * now:
        out.append({"action": "workers", "workers": best_w, "predicted": best,
                    "short": f"{best_w} workers ({best:.0f}/s)",
                    "text": f"{best_w} workers (now {workers}): predicted {best:.0f}/s against {now:.0f}/s; "
                            "more add nothing here"})
    bound = stallmodel.limits(inp, x, best_w).bound
    if bound == "cpu":
        cores = math.ceil(inp.ingestion * cpu_per_sample(inp, x, best_w))
        out.append({"action": "cores", "cores": cores, "predicted": inp.ingestion,
                    "short": f"{cores} cores ({inp.ingestion:.0f}/s)",
                    "text": f"{cores} cores (this machine gives {inp.cores}): the CPUs bind; at "
                            f"{cpu_per_sample(inp, x, best_w) * 1e3:.2f} ms of CPU a sample, the ingestion "
                            f"rate {inp.ingestion:.0f}/s needs {cores}, with enough workers to use them"})
    elif bound == "storage":
        need = inp.ingestion * (1 - x) * inp.item_bytes
        out.append({"action": "storage", "predicted": best, "short": "faster storage",
                    "text": "faster storage or a bigger cache: the storage's "
                            f"{inp.storage_bandwidth(best_w) / MiB:.0f} MiB/s binds; "
                            f"the ingestion rate needs {need / MiB:.0f} MiB/s at {x:.0%} cached"})
    return out


def _dali_advice(inp, workers, x, device) -> dict:
    left = inp.train_cpu + (1 - x) * inp.fetch_cpu
    lim = stallmodel.limits(inp, x, workers)
    ceiling = min(lim.ingestion, lim.storage, inp.cores / left if left > 0 else math.inf)
    prep = inp.at(inp.prep_cpu, workers)
    where = ("backend=\"dali\", dali_device=\"gpu\" (coordl serve --backend dali)" if device.startswith("cuda")
             else "on a machine with a GPU: backend=\"dali\", dali_device=\"gpu\"")
    return {"action": "dali", "predicted_at_most": ceiling, "short": f"DALI on a GPU (<= {ceiling:.0f}/s)",
            "text": f"decode on the GPU, {where}: prep takes {prep * 1e3:.2f} ms of the "
                    f"{cpu_per_sample(inp, x, workers) * 1e3:.2f} ms of CPU a sample costs; without it the "
                    f"CPUs allow up to {ceiling:.0f}/s (an upper bound: the GPU's decode is not measured here)"}


def _coordinator_advice(inp, workers, x) -> list[dict]:
    rows = [(k, predict_jobs(inp, x, workers, k, True), predict_jobs(inp, x, workers, k, False)) for k in JOBS]
    if all(shared <= (1 + GAIN) * own for _k, shared, own in rows):
        return []
    per = "; ".join(f"{k} jobs {shared:.0f}/s each against {own:.0f}/s with their own loaders"
                    for k, shared, own in rows)
    jobs = [{"jobs": k, "predicted_shared": s, "predicted_own": o} for k, s, o in rows]
    return [{"action": "coordinator", "short": "the coordinator for k jobs", "jobs": jobs,
             "text": f"for k jobs on this dataset at once (a hyperparameter search): the coordinator "
                     f"(coordl serve; DataLoader(..., coordinator=...)) prepares each batch once for all: "
                     f"predicted {per}"}]


def notes(inp: stallmodel.Inputs, rates: dict, cached: list[float], cold: list[float], alone: list[float],
          workers: int, cache_fraction: float, rounds: dict | None = None,
          measured_counts: list[int] | None = None) -> list[str]:
    """Why measured numbers that look contradictory are what they are (empty when none do).
    `cached`, `cold`, `alone`: rates at 1..W workers, of which `measured_counts` (all when None)
    were timed and the others fitted."""
    out = []
    prep, fetch = rates["prep"], rates["fetch"]
    spread = _spread(rounds or {})
    if fetch > (1 + stallmodel.TOLERANCE) * prep:
        out.append(
            f"The profiled run ({cache_fraction:.0%} cached, cold storage) measured {fetch:.0f}/s, faster than "
            f"training with every item cached ({prep:.0f}/s): reading storage costs nothing measurable here "
            f"(cold reads {inp.storage_bandwidth(workers) / MiB:.0f} MiB/s, {inp.read_latency * 1e3:.2f} ms each, "
            f"against {inp.at(inp.prep_cpu, workers) * 1e3:.2f} ms of CPU to prepare an item), so the two differ "
            f"by run-to-run noise{spread}; the fetch stall is counted as 0. More --steps or --repeats 3 narrow it.")
    timed = set(measured_counts or range(1, len(alone) + 1))
    free = [k for k, (c, a) in enumerate(zip(cold, alone), 1) if c >= a and k in timed]
    if free:
        at = ", ".join(f"{k}w: cold {cold[k - 1]:.0f}/s, cached {alone[k - 1]:.0f}/s" for k in free)
        out.append(
            f"A miss costs a worker 0.00 ms at {', '.join(f'{k}w' for k in free)}: the loader alone read cold "
            f"items no slower than cached ones ({at}); the read hides behind the decoding, and 0 is the measured "
            "cost (a negative difference is noise), not a missing value.")
    checks = [("with every item cached", 1.0, prep), (f"for the profiled run ({cache_fraction:.0%} cached)",
                                                       cache_fraction, fetch)]
    for what, x, measured in checks:
        lim = stallmodel.limits(inp, x, workers)
        if abs(lim.rate - measured) > CHECK_TOLERANCE * measured:
            out.append(f"The model predicts {lim.rate:.0f}/s {what} where {measured:.0f}/s was measured "
                       f"({100 * (lim.rate - measured) / measured:+.0f}%): its {lim.bound} term binds "
                       f"({_terms(lim)}); " + _why(lim.bound, inp, x, workers, cold, alone))
    best = stallmodel.predict(inp, 1.0, workers)
    if best < (1 - stallmodel.TOLERANCE) * inp.ingestion:
        out.append(f"The ingestion rate ({inp.ingestion:.0f}/s) is the train step alone on batches already in "
                   f"memory: the ceiling, not a prediction. With every item cached the model predicts "
                   f"{best:.0f}/s at {workers} workers, as its {stallmodel.limits(inp, 1.0, workers).bound} term "
                   "binds: "
                   "a cache alone cannot reach the ingestion rate.")
    return out


def _terms(lim: stallmodel.Limits) -> str:
    return ", ".join(f"{k} {v:.0f}/s" for k, v in (("model", lim.ingestion), ("workers", lim.workers),
                                                   ("storage", lim.storage), ("cpu", lim.cpu)) if math.isfinite(v))


def _why(bound: str, inp: stallmodel.Inputs, x: float, workers: int, cold: list[float], alone: list[float]) -> str:
    if bound == "cpu":
        return (f"the CPU term is {inp.cores} cores / {cpu_per_sample(inp, x, workers) * 1e3:.2f} ms a sample, "
                "CPU measured in other runs than this one (train step on synthetic batches, loader alone); on "
                "a machine busy with other work they move from run to run. --repeats 3 on a quieter machine.")
    k = min(workers, len(alone))
    miss = inp.miss_cost(workers)
    if bound == "workers" and x < 1 and cold and miss > 3 * inp.read_latency:
        return (f"a miss is priced at {miss * 1e3:.2f} ms a worker, from the loader alone on cold items at {k}w "
                f"({cold[k - 1]:.0f}/s) against cached ones ({alone[k - 1]:.0f}/s), while one cold read takes "
                f"{inp.read_latency * 1e3:.2f} ms: the cold run was held up by more than the storage (other work "
                "on the machine); --repeats 3 narrows it.")
    if bound == "workers":
        return ("the workers' pace comes from the all-cached and cold loader runs at the same worker count; "
                "their noise carries over. --repeats 3 narrows it.")
    if bound == "storage":
        return "the storage term is the measured cold-read bandwidth; a storage shared with other work varies."
    return "the ingestion run is the train step alone; noise in it carries over."


def _spread(rounds: dict) -> str:
    """' (rounds: cached 400-460/s; profiled 420-500/s)' from {name: [rates of each round]}."""
    runs = {k: v for k, v in rounds.items() if len(v) > 1}
    if not runs:
        return " (one round: no spread measured)"
    return " (rounds: " + "; ".join(f"{k} {min(v):.0f}-{max(v):.0f}/s" for k, v in runs.items()) + ")"


def _size(nbytes: float, flag: bool = False) -> str:
    """'12.0 MiB' (text) or '13MiB' (a flag value, rounded up to whole MiB)."""
    if flag:
        return f"{max(1, math.ceil(nbytes / MiB))}MiB"
    return fmt_mib(nbytes)
