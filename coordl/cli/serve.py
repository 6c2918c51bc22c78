"""`coordl serve` (the coordinator daemon) and `coordl status`."""

from __future__ import annotations

import json
import logging
import os
import sys
from types import SimpleNamespace
from typing import Any

import click

from coordl import names
from coordl.coordinator.config import ServeConfig, check_cuda_devices, default_socket_path
from coordl.errors import CoordlError

_SOCKET_HELP = f"Unix socket path (default {default_socket_path()})."


def _size(ctx, param, value):
    if value is None:
        return None
    from coordl.cache.sizes import parse_size

    try:
        return parse_size(value, "--cache")
    except CoordlError as e:
        raise click.BadParameter(str(e)) from None


@click.command("serve")
@click.option("--data", default=None, type=click.Path(file_okay=False),
              help="ImageFolder root: a folder, or a URL such as s3://bucket/prefix (see --storage-options).")
@click.option("--dataset", "dataset_class", default=None, metavar="MODULE:CLASS",
              help="Serve your coordl.CoordlDataset subclass (or coordl.datasets.audio:AudioFolder) instead of "
                   "--data, e.g. mypkg.data:MyDataset (importable by the daemon: installed, or on PYTHONPATH). "
                   "Its prep returns (tensor, int label) with a tensor of one fixed shape and a dtype among "
                   "uint8, int16, int32, int64, float16, float32, float64: the daemon takes them from its "
                   "sample_spec() (by default item 0 prepared once) and jobs get (B, *shape) batches. "
                   "--seed and --on-error are set on it.")
@click.option("--dataset-args", default=None, metavar="JSON",
              help="With --dataset: its keyword arguments as a JSON object, e.g. '{\"root\": \"/data/x\"}'.")
@click.option("--batch-size", type=int, required=True, help="Images per batch (the jobs' batch_size).")
@click.option("--transform", type=click.Choice(names.TRANSFORMS), default="train", show_default=True)
@click.option("--size", type=int, default=None,
              help="--data: the output height and width (default 224). --dataset: omit it (the samples' shape "
                   "and dtype come from the dataset), or give N for a prep that returns uint8 images (3, N, N) "
                   "or (N, N, 3), served as (B, 3, N, N).")
@click.option("--epochs", type=int, default=None,
              help="Epochs each job gets (counted from the first whole epoch it joins); the "
                   "daemon exits once every job has had them and left, or --linger seconds after "
                   "a job left with epochs to go and none resumed (default: serve until stopped).")
@click.option("--seed", type=int, default=0, show_default=True, help="Order and augmentation seed.")
@click.option("--workers", type=int, default=None, help="Prep worker processes (default: all cores).")
@click.option("--cache", "cache_bytes", default=None, callback=_size,
              help="MinIO cache budget for the encoded bytes, e.g. 8GiB: capped to the dataset's "
                   "bytes, taken from shared memory as it fills. Another size than the dataset's "
                   "existing cache makes a new one when no process uses it, else is refused.")
@click.option("--socket", "socket_path", default=None, help=_SOCKET_HELP)
@click.option("--slots", type=int, default=8, show_default=True,
              help="Ring slots K: the fastest job runs at most K batches ahead of the slowest.")
@click.option("--straggler-timeout", type=float, default=300.0, show_default=True,
              help="Seconds a job may hold the oldest batch of a full ring before it is detached.")
@click.option("--linger", type=float, default=600.0, show_default=True,
              help="With --epochs: seconds to wait for a job that left with epochs to go (preempted, "
                   "to resume from its checkpoint in a new process) before the daemon stops.")
@click.option("--min-jobs", type=int, default=1, show_default=True,
              help="Jobs to wait for before the first batch is handed out (a hard barrier).")
@click.option("--join-window", type=float, default=5.0, show_default=True,
              help="Seconds with no new job before the first batch is handed out, so jobs "
                   "launched together start at the same epoch (0: at once).")
@click.option("--hello-timeout", type=float, default=10.0, show_default=True,
              help="Seconds a connection may stay open without attaching as a job.")
@click.option("--shuffle/--no-shuffle", default=True, show_default=True)
@click.option("--drop-last/--keep-last", default=False, show_default=True)
@click.option("--on-error", type=click.Choice(names.ON_ERROR), default="raise", show_default=True,
              help="A bad image: fail its batch in the jobs, or drop it from the batch.")
@click.option("--backend", type=click.Choice(names.BACKENDS), default="cpu", show_default=True,
              help="What the prep workers decode and augment with: coordl's CPU pipeline, or "
                   "NVIDIA DALI (pip install -e '.[dali]'); one DALI thread per worker.")
@click.option("--dali-device", type=click.Choice(names.DALI_DEVICES), default="cpu", show_default=True,
              help="With --backend dali: decode on the CPU, or with nvJPEG on the GPU (the first "
                   "CUDA_VISIBLE_DEVICES device).")
@click.option("--detach", is_flag=True, help="Run in the background; log to <socket>.log.")
@click.option("--storage-options", default=None, metavar="JSON",
              help="For --data s3://... (any fsspec URL): options of its filesystem as a JSON object, "
                   "e.g. '{\"endpoint_url\": \"http://127.0.0.1:9000\"}'. Without it the AWS_* variables "
                   "are read (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).")
def serve_cmd(data, batch_size, transform, size, epochs, seed, workers, cache_bytes, socket_path,
              slots, straggler_timeout, linger, min_jobs, join_window, hello_timeout, shuffle, drop_last,
              on_error, backend, dali_device, detach, storage_options, dataset_class, dataset_args):
    """The coordinator daemon: prepare each batch once, for every attached job.

    Jobs attach with coordl.DataLoader(coordl.ImageFolder(DIR), batch_size=B,
    shuffle=True, coordinator="unix://SOCKET"). SIGTERM or SIGINT stops it cleanly.
    """
    from coordl.coordinator.daemon import Daemon
    from coordl.datasets.sources import parse_storage_options

    extra: dict[str, Any] = {k: v for k, v in (("workers", workers), ("socket", socket_path),
                               ("storage_options", parse_storage_options(storage_options))) if v is not None}
    extra.update(_dataset_options(dataset_class, dataset_args))
    config = ServeConfig(data=data or "", batch_size=batch_size, transform=transform, size=size,
                         epochs=epochs, seed=seed, cache_bytes=cache_bytes, slots=slots,
                         straggler_timeout=straggler_timeout, linger=linger, min_jobs=min_jobs,
                         join_window=join_window, hello_timeout=hello_timeout, shuffle=shuffle,
                         drop_last=drop_last, on_error=on_error, backend=backend,
                         dali_device=dali_device, **extra)
    if config.dali_device == "gpu":
        check_cuda_devices()
    daemon = Daemon(config)  # scans the dataset here, so its errors reach this terminal
    if detach:
        _detach(daemon)
        return
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s coordl serve[%(process)d]: %(message)s")
    daemon.run(ready=_announce)  # returns when stopped as told; a failure raises


def _dataset_options(dataset_class: str | None, dataset_args: str | None) -> dict:
    """--dataset and --dataset-args as ServeConfig fields (bad JSON named)."""
    if dataset_args is None:
        return {"dataset": dataset_class} if dataset_class else {}
    try:
        args = json.loads(dataset_args)
    except ValueError as e:
        raise click.BadParameter(f"{dataset_args!r} is not JSON ({e}): pass an object such as "
                                 "'{\"root\": \"/data/x\"}'", param_hint="--dataset-args") from None
    return {"dataset": dataset_class, "dataset_args": args}


def _announce(daemon) -> None:
    click.echo(f"coordl serve: pid {os.getpid()} listening on unix://{daemon.socket_path} "
               f"({len(daemon.dataset)} items, batch {daemon.plan.batch_size}, "
               f"{daemon.layout.slots} slots, {daemon.config.workers} workers, "
               f"{_backend(daemon.config)})")
    sys.stdout.flush()


def _backend(config) -> str:
    return "dali " + config.dali_device if config.backend == "dali" else "cpu"


def _detach(daemon) -> None:
    """Double fork: the grandchild serves in its own session; this process returns once it listens."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child:
        os.close(write_fd)
        os.waitpid(child, 0)
        with os.fdopen(read_fd, "rb") as pipe:
            line = pipe.readline().decode(errors="replace").strip()
        if not line.startswith("coordl serve:"):
            raise CoordlError(line or f"the daemon exited before it listened: see "
                              f"{daemon.socket_path}.log")
        click.echo(line)
        return
    os.close(read_fd)
    os.setsid()
    if os.fork():
        os._exit(0)
    log_path = daemon.socket_path + ".log"
    code = 1
    try:
        os.makedirs(os.path.dirname(log_path), mode=0o700, exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s coordl serve[%(process)d]: %(message)s")

        def ready(d) -> None:
            os.write(write_fd, (f"coordl serve: pid {os.getpid()} listening on "
                                f"unix://{d.socket_path} ({_backend(d.config)}; log: "
                                f"{log_path})\n").encode())
            os.close(write_fd)

        daemon.run(ready=ready, private_fds=(write_fd,))
        code = 0
    except BaseException as e:
        try:
            os.write(write_fd, f"coordl serve: error: {e}\n".encode())
        except OSError:
            pass
        logging.getLogger("coordl.serve").exception("the daemon failed")
    finally:
        os._exit(code)


def _jobs_and_others(st: dict) -> str:
    """'N jobs attached, M other connections' (this status request's own not counted)."""
    jobs = len(st["jobs"])
    others = st["connections"] - jobs
    return (f"{jobs} job{'' if jobs == 1 else 's'} attached, {others} other "
            f"connection{'' if others == 1 else 's'}")


@click.command("status")
@click.option("--socket", "socket_path", default=None, help=_SOCKET_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status_cmd(socket_path, as_json):
    """Attached jobs, each job's position, ring occupancy, images/s of a coordinator."""
    from coordl.coordinator.channel import status

    st = status(socket_path)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    occ = st["occupancy"]
    samples = f"{st['size']}px" if st["size"] else \
        f"samples {st['sample_dtype']} ({', '.join(map(str, st['sample_shape']))})"
    click.echo(f"coordinator pid {st['pid']} on unix://{st['socket']}, up {st['uptime_s']:.0f} s\n"
               f"  dataset    {st['data']} ({st['items']} items, fingerprint {st['fingerprint'][:12]}, "
               f"{st['transform']} {samples})\n"
               f"  plan       batch {st['batch_size']}, {st['batches_per_epoch']} batches/epoch, "
               f"epochs per job {st['epochs'] or 'unlimited'}, seed {st['seed']}"
               f"{'' if st['shuffle'] else ', no shuffle'}{', drop last' if st['drop_last'] else ''}"
               f", on_error {st['on_error']}\n"
               f"  ring       {st['slots']} slots ({st['ring_mib']} MiB): {occ['ready']} ready, "
               f"{occ['filling']} filling, {occ['failed']} failed, {occ['free']} free\n"
               f"  prep       {len(st['workers'])} workers, backend {_backend(SimpleNamespace(**st))}, "
               f"{st['images_per_s']:.0f} images/s, "
               f"{st['produced_batches']} batches, {st['decodes']} decodes\n"
               f"  clients    {_jobs_and_others(st)} (limit {st['max_connections']} connections)"
               + (f"; holding the first batch for jobs still joining (--join-window "
                  f"{st['join_window']:g} s, --min-jobs {st['min_jobs']})" if st["gathering"] else ""))
    if not st["jobs"]:
        click.echo("  jobs       none attached")
    for j in st["jobs"]:
        # every epoch number is the daemon's, from 0, as the job's loader.epoch reads it
        mine = (f"its epochs {j['start_epoch']}-{j['start_epoch'] + j['epochs'] - 1}" if j["epochs"]
                else f"its epochs {j['start_epoch']} on")
        where = (f"epoch {j['epoch']} ({mine}), {j['batch']} of {j['batches_per_epoch']} batches "
                 f"handed out" if j["epoch"] is not None else f"between epochs ({mine})")
        click.echo(f"  job {j['job']:<4}  pid {j['pid']:<8} {where}, holds {len(j['holding'])}, "
                   f"{'waiting' if j['waiting'] else 'working'}, idle {j['idle_s']:.1f} s, "
                   f"{j['batches']} batches")

