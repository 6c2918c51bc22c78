"""Whether a job may attach: every setting that changes a batch must be the daemon's.

Pure: the daemon calls `mismatch` with the job's Hello, its own dataset and its
plan, and refuses the job with the text it returns. The dataset (fingerprint
and length), seed, on_error, transform, size, batch size, shuffle and
drop_last decide every pixel and label of every batch (plan.py), so a job
that differs in any of them would silently get batches it did not ask for;
except that a daemon that keeps the last batch (--keep-last, the default)
serves every batch size and drop_last: its batches are chunks that cover each
epoch, and a job of another batch size cuts its own from them (assemble.py).
A dataset served by its sample spec (spec.py: ``coordl serve --dataset`` without
--size) is also compared by it: a job whose dataset's samples have another
shape or dtype (built with other arguments, e.g. AudioFolder(seconds=...))
is refused naming both.
"""

from __future__ import annotations

from . import protocol as p
from .plan import Plan
from .spec import SampleSpec

_FLAG = {"seed": "--seed {}", "on_error": "--on-error {}", "transform": "--transform {}",
         "size": "--size {}", "batch_size": "--batch-size {}"}


def _flag(name: str, value) -> str:
    """The `coordl serve` flag that gives `name` the value `value`."""
    if name == "shuffle":
        return "--shuffle" if value else "--no-shuffle"
    if name == "drop_last":
        return "--drop-last" if value else "--keep-last"
    if name == "transform" and ":" in str(value):  # a user's dataset class (coordl serve --dataset)
        path, _, settings = str(value).partition(" [")
        return f"--dataset {path}" + (f" with --dataset-args giving {settings.rstrip(']')}" if settings else "")
    return _FLAG[name].format(value)


def mismatch(msg: p.Hello, dataset, plan: Plan, spec: SampleSpec | None = None) -> str | None:
    """None when the job would get exactly the batches it asks for; else one text naming every
    difference, each with the daemon's value, and the fix. `spec` is the daemon's sample spec:
    one taken from its dataset (not `hwc`: an image ring's size is compared as `size`) must be
    the job's dataset's too."""
    if msg.version != p.VERSION:
        return (f"protocol version {msg.version} (job) != {p.VERSION} (daemon): run the same "
                "coordl version in the job and the daemon")
    diffs, serve_with = [], []
    root, transform, size = dataset.served_as()  # (coordl/datasets/base.py: a user's class by its path)
    if msg.fingerprint != dataset.fingerprint or msg.items != len(dataset):
        diffs.append(f"dataset fingerprint {msg.fingerprint[:12]} ({msg.items} items in "
                     f"'{p.printable(msg.root)}', the job's) != {dataset.fingerprint[:12]} "
                     f"({len(dataset)} items in '{p.printable(root)}', the daemon's: "
                     "point the job and the daemon at the same dataset folder; if its files "
                     "changed since the daemon started, restart the daemon)")
    for name, job_value, ours in (
            ("seed", msg.seed, plan.seed), ("on_error", msg.on_error, dataset.on_error),
            ("transform", msg.transform, transform), ("size", msg.size, size),
            ("batch_size", msg.batch_size, plan.batch_size), ("shuffle", msg.shuffle, plan.shuffle),
            ("drop_last", msg.drop_last, plan.drop_last)):
        if name in ("batch_size", "drop_last") and not plan.drop_last:
            continue  # the daemon's chunks cover every epoch: a job cuts batches of its own (assemble.py)
        if job_value != ours:
            diffs.append(f"{name}={job_value!r} (job) != the daemon's {name}={ours!r} "
                         f"({_flag(name, ours)})")
            serve_with.append(_flag(name, job_value))
    if spec is not None and not spec.hwc:
        job_spec = SampleSpec(tuple(msg.sample_shape), msg.sample_dtype)
        if job_spec != spec:
            diffs.append(f"samples {job_spec.describe()} (the job's dataset's sample_spec()) != the "
                         f"daemon's {spec.describe()} (its dataset's at its start): build the job's "
                         "dataset with the daemon's --dataset-args")
    if not diffs:
        return None
    fix = "give the job the daemon's values"
    if serve_with:
        fix += f", or serve the job's with another daemon (coordl serve {' '.join(serve_with)})"
    if plan.drop_last and any(s.startswith(("--batch-size", "--keep-last")) for s in serve_with):
        fix += ("; a daemon started with --keep-last (the default) serves jobs of every batch size "
                "and drop_last")
    things = "1 thing that changes" if len(diffs) == 1 else f"{len(diffs)} things that change"
    return (f"the job differs from the coordinator in {things} a batch: {'; '.join(diffs)}. "
            f"To attach, {fix}")
