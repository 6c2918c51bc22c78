"""`coordl profile`: the stall profiler's command line (the work is in coordl/profiler/)."""

from __future__ import annotations

import importlib
import os
import signal
import sys

import click

from coordl import names
from coordl.errors import ConfigError

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
/dev/shm) are removed on every exit: Ctrl-C, SIGTERM and SIGHUP (a closed
terminal) included. Every argument, and the folders of --json and --plot, are
checked before anything is measured.
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
    from coordl.cache.sizes import parse_size

    return parse_size(value, "--cache")


_FIXES = {
    "--batch-size": "pass e.g. --batch-size 64",
    "--workers": "pass e.g. --workers 2 (the loader workers of the run being profiled)",
    "--steps": "pass e.g. --steps 10",
    "--repeats": "pass 1, or 3 on a busy machine",
    "--threads": "pass e.g. --threads 1, or leave it out (cores minus --workers, at least 1)",
}


def check_counts(**flags: int | None) -> None:
    """Each flag (``batch_size=64`` for --batch-size) an int >= 1, or None where it may be left out."""
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is None and key in ("threads", "steps"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag}={value!r} must be an int >= 1: {_FIXES[flag]}")


def check_output(flag: str, path: str | None) -> None:
    """Refuse, before the run, an output path whose folder is missing, not a folder or not
    writable, or that is itself a folder: the profile's result would be lost after the run."""
    if path is None:
        return
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a folder: pass a file name, e.g. {flag} "
                          f"{os.path.join(path, 'profile' + ('.png' if flag == '--plot' else '.json'))}")
    if not os.path.exists(folder):
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist: create it "
                          f"(mkdir -p {folder}) or pass a path in an existing folder")
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {path}: {folder} is not a folder: pass a path in a folder")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable by this user: pass a path in a folder you may "
                          "write to")


class _Terminated(SystemExit):
    """SIGTERM or SIGHUP came: the profile unwinds (its `finally` drops the caches) and exits 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signame = signal.Signals(signum).name


def _children_end_with_us(_signum, _frame) -> None:
    """SIGCHLD while the profile exits on a signal: a worker that got it too has ended; nothing to do."""


def _raise_exit(signum, _frame) -> None:
    # Sent to the whole process group (as `timeout` and a closing terminal send it), the signal
    # also ends the loader's workers; torch's SIGCHLD handler would then raise "worker killed by
    # signal" in the middle of this exit's cleanup (two chained tracebacks). Their deaths are part
    # of this exit: a SIGCHLD handler that does nothing (not SIG_DFL: Python reports a pending
    # SIGCHLD whose handler became the default as "ignored due to race condition").
    if hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, _children_end_with_us)
    raise _Terminated(signum)


def _exit_cleanly_on_signals() -> None:
    """SIGTERM and SIGHUP (a closed terminal) raise SystemExit, so the profile's `finally` drops
    its temporary caches as on Ctrl-C, whether the signal came to this process alone or to its
    whole process group (its loader workers too). A signal that is ignored (nohup) stays ignored."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _raise_exit)


def _write(flag: str, path: str, write) -> None:
    try:
        write()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: could not be written ({e.strerror or e}): the table above "
                          "holds the result; pass another path to keep a file") from None


@click.command("profile", help=_HELP)
@click.option("--data", required=True,
              help="ImageFolder root (DIR/<class>/<image>.jpg), e.g. from coordl make-dataset, or a URL "
                   "such as s3://bucket/prefix (see --storage-options).")
@click.option("--storage-options", default=None, metavar="JSON",
              help="For --data s3://... (any fsspec URL): its filesystem's options as a JSON object "
                   "(endpoint_url, anon, ...); without it the AWS_* variables are read.")
@click.option("--model", "model_name", default=None,
              help="small-cnn (default), resnet18, or any torchvision model by name (resnet50, vit_b_16, ...; "
                   "needs torchvision: pip install 'coordl[torchvision]').")
@click.option("--train-step", default=None, metavar="MODULE:FUNCTION",
              help="Your train step instead: FUNCTION(batch) runs one step on [images, labels] "
                   "and returns the loss.")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True,
              help="Loader workers of the profiled run (prep is measured at 1..W).")
@click.option("--steps", type=int, default=None,
              help="Timed steps per measurement [default: 10, or fewer to fit the dataset (said so)].")
@click.option("--cache", "--cache-bytes", "cache_bytes", default="0", show_default=True,
              help="MinIO cache of the profiled run: bytes or a size ('50MiB'); 0: none. "
                   "(--cache-bytes: the old name, kept.)")
@click.option("--device", type=click.Choice(names.PROFILE_DEVICES), default="cpu", show_default=True)
@click.option("--threads", type=int, default=None, help="torch threads of the training process (cpu).")
@click.option("--json", "json_out", default=None, help="Write JSON here (its folder must exist).")
@click.option("--plot", "plot_out", default=None,
              help="Write a PNG of the what-if curves here (needs matplotlib: pip install -e '.[profile]').")
@click.option("--validate", is_flag=True, help="Measure two predictions (another cache size, "
                                               "another worker count) and report the error.")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Rounds of every timed run, interleaved; the median is kept (busy machines: 3).")
@click.option("--seed", type=int, default=0, show_default=True)
def profile_cmd(data, model_name, train_step, batch_size, workers, steps, cache_bytes, device, threads,
                json_out, plot_out, validate, repeats, seed, storage_options):
    if model_name and train_step:
        raise ConfigError("pass --model or --train-step, not both")
    check_counts(batch_size=batch_size, workers=workers, steps=steps, repeats=repeats, threads=threads)
    check_output("--json", json_out)
    check_output("--plot", plot_out)
    if json_out and plot_out and os.path.abspath(json_out) == os.path.abspath(plot_out):
        raise ConfigError(f"--json and --plot are both {json_out}: pass two different paths")
    nbytes = _cache_bytes(cache_bytes)

    import torch

    import coordl
    from coordl.profiler import networks, profile
    if plot_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib: pip install 'coordl[profile]' (or matplotlib), "
                              "or leave out --plot") from None
    from coordl.datasets.sources import parse_storage_options

    ds = coordl.ImageFolder(data, transform="train", seed=seed, storage_options=parse_storage_options(storage_options))
    if device == "cpu":
        torch.set_num_threads(threads or max(1, len(os.sched_getaffinity(0)) - max(workers, 0)))
    elif threads:
        torch.set_num_threads(threads)
    if train_step:
        step, label = _train_step_from(train_step), train_step
    else:
        label = model_name or networks.DEFAULT_MODEL
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is "
                              "False): pass --device cpu, or run on a machine with a GPU")
        step = networks.train_step_for(networks.build(label, len(ds.classes)), device)
    if steps is None:
        from coordl.profiler.run import DEFAULT_STEPS, fit_steps, fitted_steps_line

        steps = fit_steps(len(ds), batch_size)
        if steps < DEFAULT_STEPS:
            click.echo(f"coordl profile: {fitted_steps_line(len(ds), batch_size, steps)}", err=True)
    _exit_cleanly_on_signals()
    try:
        result = profile(step, ds, batch_size=batch_size, num_workers=workers, steps=steps,
                         cache_bytes=nbytes, device=device, validate=validate, repeats=repeats, seed=seed,
                         settings={"model": label, "torch_threads": torch.get_num_threads()})
    except KeyboardInterrupt:
        click.echo("coordl profile: interrupted; its temporary caches are removed", err=True)
        sys.exit(130)
    except _Terminated as e:
        click.echo(f"coordl profile: terminated ({e.signame}); its temporary caches are removed", err=True)
        sys.exit(e.code)
    click.echo(result.table())
    if json_out:
        def write_json() -> None:
            with open(json_out, "w") as f:
                f.write(result.to_json())
        _write("--json", json_out, write_json)
        click.echo(f"wrote {json_out}")
    if plot_out:
        _write("--plot", plot_out, lambda: result.plot(plot_out))
        click.echo(f"wrote {plot_out}")
