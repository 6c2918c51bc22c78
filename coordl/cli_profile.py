"""`coordl profile`: the stall profiler's command line (the work is in coordl/profiler/)."""

from __future__ import annotations

import importlib
import os
import signal
import sys

import click

from .errors import ConfigError

_HELP = """Where does training wait: on storage (fetch stall), on decode and augmentation
(prep stall), or on nothing? Measures, by difference (DS-Analyzer), the training
throughput on synthetic batches in memory, with every item cached in memory (at 1..W
workers) and from cold storage; splits an epoch into compute, prep stall and fetch
stall; predicts the throughput for other cache sizes and worker counts; --validate
measures two of those predictions.

The default model, small-cnn, subsamples the image 4x and runs three small
convolutions: on a CPU-only machine its step costs a fraction of a JPEG decode, so
data loading, not the model, can be the bottleneck. resnet18 is the real thing
(model-bound on a CPU). With --device cpu the training process gets cores minus
--workers torch threads (at least 1; --threads to change), as the workers need the rest.

Each measurement runs 2 warm-up steps and --steps timed steps on distinct items,
so the dataset needs (steps + 2) x batch-size items. Temporary caches (in
/dev/shm) are removed on every exit, Ctrl-C included.
"""


def _train_step_from(spec: str):
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"--train-step {spec!r} is not module:function: pass e.g. "
                          "--train-step mytrain:step (mytrain.py in the current folder)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        raise ConfigError(f"--train-step {spec!r}: cannot import module {module!r} "
                          f"({type(e).__name__}: {e}): check the name and that it is on PYTHONPATH") from e
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ConfigError(f"--train-step {spec!r}: {module} has no function {name!r}: pass the name of "
                          "a function that runs one step on a batch [images, labels] and returns the loss")
    return fn


def _cache_bytes(value: str) -> int:
    if value.strip() in ("0", "0B", "0b"):
        return 0
    from .caching import parse_size

    return parse_size(value, "--cache-bytes")


def _raise_exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


@click.command("profile", help=_HELP)
@click.option("--data", required=True, type=click.Path(exists=True, file_okay=False),
              help="ImageFolder root (DIR/<class>/<image>.jpg), e.g. from coordl make-dataset.")
@click.option("--model", "model_name", default=None,
              help="Built-in model: small-cnn (default) or resnet18.")
@click.option("--train-step", default=None, metavar="MODULE:FUNCTION",
              help="Your train step instead: FUNCTION(batch) runs one step on [images, labels] "
                   "and returns the loss.")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True,
              help="Loader workers of the profiled run (prep is measured at 1..W).")
@click.option("--steps", type=int, default=10, show_default=True, help="Timed steps per measurement.")
@click.option("--cache-bytes", default="0", show_default=True,
              help="MinIO cache of the profiled run: bytes or a size ('50MiB'); 0: none.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=None, help="torch threads of the training process (cpu).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write JSON here.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of the what-if curves here (needs matplotlib: pip install coordl[profile]).")
@click.option("--validate", is_flag=True, help="Measure two predictions (another cache size, "
                                               "another worker count) and report the error.")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Rounds of every timed run, interleaved; the median is kept (busy machines: 3).")
@click.option("--seed", type=int, default=0, show_default=True)
def profile_cmd(data, model_name, train_step, batch_size, workers, steps, cache_bytes, device, threads,
                json_out, plot_out, validate, repeats, seed):
    import torch

    import coordl
    from coordl.profiler import models, profile

    if model_name and train_step:
        raise ConfigError("pass --model or --train-step, not both")
    if plot_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib: pip install 'coordl[profile]' (or matplotlib), "
                              "or leave out --plot") from None
    nbytes = _cache_bytes(cache_bytes)
    ds = coordl.ImageFolder(data, transform="train", seed=seed)
    if device == "cpu":
        torch.set_num_threads(threads or max(1, len(os.sched_getaffinity(0)) - max(workers, 0)))
    elif threads:
        torch.set_num_threads(threads)
    if train_step:
        step, label = _train_step_from(train_step), train_step
    else:
        label = model_name or models.DEFAULT_MODEL
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is "
                              "False): pass --device cpu, or run on a machine with a GPU")
        step = models.train_step_for(models.build(label, len(ds.classes)), device)
    signal.signal(signal.SIGTERM, _raise_exit)
    try:
        result = profile(step, ds, batch_size=batch_size, num_workers=workers, steps=steps,
                         cache_bytes=nbytes, device=device, validate=validate, repeats=repeats, seed=seed,
                         settings={"model": label, "torch_threads": torch.get_num_threads()})
    except KeyboardInterrupt:
        click.echo("coordl profile: interrupted; its temporary caches are removed", err=True)
        sys.exit(130)
    click.echo(result.table())
    if json_out:
        with open(json_out, "w") as f:
            f.write(result.to_json())
        click.echo(f"wrote {json_out}")
    if plot_out:
        result.plot(plot_out)
        click.echo(f"wrote {plot_out}")
