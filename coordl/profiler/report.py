"""The profile as a text table and as a PNG (matplotlib)."""

from __future__ import annotations

from coordl.cache.sizes import fmt_mib as _mib

MiB = 2**20


def table(r) -> str:
    s, m, e, w = r.settings, r.measured, r.epoch, r.what_if
    prof = m["profiled"]
    lines = [
        f"coordl profile: {s['dataset']} ({s['items']} items, {_mib(s['dataset_bytes'])}), "
        f"batch {s['batch_size']}, {s['workers']} workers, cache {_mib(s['cache_bytes'])} "
        f"({prof['cache_fraction']:.0%} of the items), device {s['device']}, {s['steps']} timed steps "
        f"per run ({s['warmup_steps']} warm-up)" + (f", model {s['model']}" if s.get("model") else ""),
        "",
        f"verdict: {r.verdict['text']}" if r.verdict else "verdict: (not computed)",
        "",
        "rates (samples/s, training throughput measured)",
        f"  ingestion  synthetic batches in memory          {r.rates['ingestion']:9.1f}",
        f"  prep       every item cached, {s['workers']} workers          {r.rates['prep']:9.1f}",
        f"  fetch      profiled run ({prof['cache_fraction']:.0%} cached, cold storage) {r.rates['fetch']:9.1f}",
        "",
        f"epoch of {s['items']} items      seconds      %",
        f"  compute              {e['compute_s']:8.2f}  {r.compute_pct:5.1f}",
        f"  prep stall           {e['prep_stall_s']:8.2f}  {r.prep_stall_pct:5.1f}",
        f"  fetch stall          {e['fetch_stall_s']:8.2f}  {r.fetch_stall_pct:5.1f}",
        f"  total                {e['total_s']:8.2f}",
        "",
        "measured inputs of the model" + _fitted(m),
        "  prep alone (loader only, all cached): "
        + ", ".join(f"{p['workers']}w {p['samples_per_s']:.0f}/s" for p in m["prep_alone_by_workers"]),
        "  prep alone (loader only, cold storage): "
        + ", ".join(f"{p['workers']}w {p['samples_per_s']:.0f}/s" for p in m.get("prep_cold_by_workers", []))
        + "; a miss costs a worker "
        + ", ".join(f"{c * 1e3:.2f} ms ({k}w{'' if here else ', idle read: cold run storage-bound'})"
                    for k, (c, here) in enumerate(zip(m.get("miss_cost_by_workers", []),
                                                      m.get("miss_cost_in_place_by_workers", [])), 1)),
        "  train, all cached: "
        + ", ".join(f"{p['workers']}w {p['samples_per_s']:.0f}/s" for p in m["train_cached_by_workers"]),
        "  storage, cold reads: "
        + ", ".join(f"{k} readers {b / MiB:.1f} MiB/s" for k, b in enumerate(m["storage_bw_by_readers"], 1)
                    if k in m.get("worker_counts_measured", [k])),
        f"  storage: {_storage(m.get('storage'))}",
        f"  storage, one cold read on idle storage: {m['inputs']['read_latency'] * 1e3:.2f} ms; "
        f"memory (reads out of the MinIO cache): {m['memory_bw'] / MiB:.0f} MiB/s",
        f"  CPU per sample: train step {m['inputs']['train_cpu'] * 1e3:.2f} ms, loader "
        + ", ".join(f"{c * 1e3:.2f} ms ({k}w)" for k, c in enumerate(m["inputs"]["prep_cpu"], 1)
                    if k in m.get("worker_counts_measured", [k]))
        + f", a cold read {m['inputs']['fetch_cpu'] * 1e3:.2f} ms; {m['inputs']['cores']} cores",
        f"  CPU use, profiled run: {_busy(m['cpu_cores_busy'], m['inputs']['cores'])}; memory: training process "
        f"max RSS {_mib(m['max_rss_main_bytes'])}, largest worker {_mib(m['max_rss_worker_bytes'])}, "
        f"cache {_mib(s['cache_bytes'])}",
        "",
        f"what if: cache size ({s['workers']} workers)     predicted samples/s   bound",
    ]
    for row in w["by_cache"]:
        lines.append(f"  {row['cache_fraction']:4.0%}  {_mib(row['cache_bytes']):>11}         "
                     f"{row['predicted']:9.1f}   {row['bound']}")
    lines.append(f"what if: workers ({m['profiled']['cache_fraction']:.0%} cached)     predicted samples/s   bound")
    for row in w["by_workers"]:
        lines.append(f"  {row['workers']:3d}                         {row['predicted']:9.1f}   {row['bound']}")
    sc, fw = w["smallest_cache"], w["fewest_workers"]
    lines += [
        "",
        f"smallest cache that removes the fetch stall ({sc['workers']} workers): "
        f"{sc['fetch_stall']:.0%} of the dataset ({_mib(sc['fetch_stall_bytes'])})",
        "fewest workers that remove the prep stall (all cached): "
        + (str(fw["prep_stall"]) if fw["prep_stall"] is not None else f"none ({fw['note']}); "
           f"best rate from {fw['best_at']} workers"),
        f"model check on the measured runs: profiled {m['predicted_profiled']:.1f} predicted vs "
        f"{r.rates['fetch']:.1f} measured; all cached {m['predicted_all_cached']:.1f} vs {r.rates['prep']:.1f}",
    ]
    if r.validation:
        lines += ["", "validation           predicted  measured   error"]
        for v in r.validation:
            c = v["config"]
            lines.append(f"  {c['cache_fraction']:4.0%} cached, {c['workers']}w   {v['predicted']:9.1f} "
                         f"{v['measured']:9.1f}  {v['error_pct']:+6.1f}%"
                         + ("" if v.get("within_tolerance", True) else "  OUTSIDE +-15%: see notes"))
    if r.notes:
        lines += ["", "notes (numbers that look contradictory, explained)"]
        lines += [_wrap(f"- {n}") for n in r.notes]
    if r.verdict:
        lines += ["", f"verdict: {r.verdict['text']}", "advice (from the model's predictions):"]
        lines += [_wrap(f"- {a['text']}") for a in r.advice] or ["- none"]
    return "\n".join(lines)


def _fitted(m: dict) -> str:
    fitted = m.get("worker_counts_fitted") or []
    if not fitted:
        return ""
    return (f" (timed at {', '.join(map(str, m['worker_counts_measured']))} workers; "
            f"{', '.join(map(str, fitted))} fitted between them)")


def _storage(st: dict | None) -> str:
    if not st:
        return "(not recorded)"
    return f"{st['kind']}, " + ("page cache dropped before every cold read" if st["cold"] else
                                "its page cache could not be dropped: cold numbers may be too fast (see notes)")


def _busy(cores_busy: float, cores: int) -> str:
    if cores_busy != cores_busy:  # nan: the workers' CPU could not be read
        return "cores busy unknown (the workers' CPU could not be read)"
    return f"{cores_busy:.2f} of {cores} cores busy over the timed steps"


def _wrap(text: str, width: int = 100) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  "))


def plot(r, path: str) -> str:
    """The epoch's stall split (measured, and predicted for the advised configurations) as stacked
    bars, then both what-if curves with the measured points on them, scaled to the data; the
    verdict in the title. Returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    w, m, s = r.what_if, r.measured, r.settings
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(15, 5.2), gridspec_kw={"width_ratios": [1.15, 1, 1]})
    _stall_bars(ax0, r)
    xs = [row["cache_fraction"] * 100 for row in w["by_cache"]]
    ax1.plot(xs, [row["predicted"] for row in w["by_cache"]], "-", label="predicted")
    ax1.plot([m["profiled"]["cache_fraction"] * 100, 100], [r.rates["fetch"], r.rates["prep"]], "o",
             label="measured")
    ws = [row["workers"] for row in w["by_workers"]]
    ax2.plot(ws, [row["predicted"] for row in w["by_workers"]], "-",
             label=f"predicted, {m['profiled']['cache_fraction']:.0%} cached")
    if "by_workers_all_cached" in w:
        ax2.plot(ws, [row["predicted"] for row in w["by_workers_all_cached"]], "--", color="C1",
                 label="predicted, all cached")
    ax2.plot([p["workers"] for p in m["train_cached_by_workers"]],
             [p["samples_per_s"] for p in m["train_cached_by_workers"]], "s", label="measured, all cached")
    ax2.plot([s["workers"]], [r.rates["fetch"]], "o", label="measured, profiled run")
    for v in r.validation:
        c = v["config"]
        if c["workers"] == s["workers"]:
            ax1.plot([c["cache_fraction"] * 100], [v["measured"]], "x", ms=9, color="k", label="validation")
        else:
            ax2.plot([c["workers"]], [v["measured"]], "x", ms=9, color="k", label="validation")
    for ax in (ax1, ax2):
        _scale_to_data(ax, r.rates["ingestion"])
        ax.set_ylabel("training samples/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    ax1.set_title("what if: cache size", fontsize=9)
    ax2.set_title("what if: prep workers", fontsize=9)
    ax1.set_xlabel(f"cache size, % of the dataset ({s['workers']} workers)")
    ax2.set_xlabel(f"prep workers ({m['profiled']['cache_fraction']:.0%} cached)")
    ax2.set_xticks(ws)
    head = r.verdict.get("text", "") if r.verdict else ""
    if r.advice:
        head += "\nadvice: " + "; ".join(a["short"] for a in r.advice[:3])
    fig.suptitle(f"{head}\ncoordl profile: {s['dataset']}, batch {s['batch_size']}, {s['workers']} workers, "
                 f"device {s['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _stall_bars(ax, r) -> None:
    """Stacked bars, seconds per epoch: compute, prep stall, fetch stall; measured first."""
    bars = r.stall_bars
    labels = [b["label"] for b in bars]
    bottom = [0.0] * len(bars)
    for key, name, color in (("compute_s", "compute", "#4c72b0"), ("prep_stall_s", "prep stall", "#dd8452"),
                             ("fetch_stall_s", "fetch stall", "#c44e52")):
        vals = [b[key] for b in bars]
        drawn = ax.bar(range(len(bars)), vals, bottom=bottom, color=color, label=name, edgecolor="white")
        for patch, b in zip(drawn, bars):
            if b["kind"] == "predicted":  # predicted: lighter and hatched
                patch.set_alpha(0.55)
                patch.set_hatch("//")
        bottom = [b + v for b, v in zip(bottom, vals)]
    top = max(bottom) if bottom else 1.0
    for k, total in enumerate(bottom):
        ax.text(k, total + 0.02 * top, f"{total:.2f} s", ha="center", fontsize=7)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel(f"seconds per epoch ({r.settings['items']} items)")
    ax.set_title("where an epoch goes (first bar measured, others predicted)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3, axis="y")


def _scale_to_data(ax, ingestion: float) -> None:
    """y from 0 to a little above the curves and points; the ingestion rate drawn as a line when it
    is near them, else named in a corner (a line far above squashed the curves into the bottom)."""
    top = max((max(line.get_ydata()) for line in ax.get_lines() if len(line.get_ydata())), default=1.0)
    if ingestion <= 1.5 * top:
        ax.axhline(ingestion, ls=":", color="gray", label="ingestion (model only)")
        top = max(top, ingestion)
    else:
        ax.text(0.02, 0.97, f"ingestion (model only): {ingestion:,.0f}/s, above the plot",
                transform=ax.transAxes, fontsize=7, va="top", color="gray")
    ax.set_ylim(0, top * 1.12)
