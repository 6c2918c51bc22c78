"""The `coordl` command line."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import click

from coordl.cli import cache as cli_cache
from coordl.cli import cachenode as cli_cachenode
from coordl.cli import profile as cli_profile
from coordl.cli import serve as cli_serve
from coordl.errors import CoordlError


def _fail(e: Exception) -> None:
    click.echo(f"coordl: error: {e}", err=True)
    sys.exit(2)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CoordlError as e:
            _fail(e)


@click.group(cls=_Group)
@click.version_option(package_name="coordl")
def main() -> None:
    """coordl: a PyTorch data loader that removes data stalls."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json: bool) -> None:
    """Versions, the active Pillow build (plain or SIMD) and optional backends."""
    from coordl.cli.info import collect

    facts = collect()
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        click.echo(f"{key:>16}: {value}")


@main.command("make-dataset")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--images", type=int, required=True, help="Number of images.")
@click.option("--classes", type=int, required=True, help="Number of class folders.")
@click.option("--size", default="500x375", show_default=True, help="WIDTHxHEIGHT of each image.")
@click.option("--quality", type=int, default=90, show_default=True, help="JPEG quality.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--large-fraction", type=float, default=0.0, show_default=True,
              help="Fraction of images made at --large-size (real datasets hold large photos).")
@click.option("--large-size", default="1500x1125", show_default=True)
@click.option("--workers", type=int, default=None, help="Processes (default: all cores).")
@click.option("--overwrite", is_flag=True,
              help="Replace a dataset make-dataset wrote in DIRECTORY before (without it, a "
                   "non-empty DIRECTORY is refused).")
def make_dataset_cmd(directory, images, classes, size, quality, seed, large_fraction, large_size, workers,
                     overwrite):
    """Write a deterministic ImageNet-like JPEG folder DIRECTORY/<class>/<image>.jpg.

    DIRECTORY must be new or empty (or hold an earlier make-dataset output, with --overwrite)."""
    from coordl.cache.sizes import fmt_mib
    from coordl.cli.make_dataset import make_dataset, parse_dims

    t0 = time.perf_counter()
    total = make_dataset(directory, images, classes, parse_dims(size), quality, seed,
                         large_fraction, parse_dims(large_size), workers, overwrite=overwrite)
    click.echo(f"wrote {images} images in {classes} classes to {directory}: "
               f"{fmt_mib(total)}, mean {total / images / 1024:.1f} KiB/image, "
               f"{time.perf_counter() - t0:.1f} s")


@main.command()
@click.option("--images", type=int, default=600, show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed epochs per loader: interleaved rounds after one warm-up epoch each, "
                   "as bench/loaders.py --repeats.")
@click.option("--data", type=click.Path(), default=None,
              help="Use this ImageFolder instead of making a temporary one.")
def demo(images, batch_size, workers, epochs, data):
    """End to end: make a small dataset, load it with coordl and with torch, compare."""
    from coordl.cli.demo import run_demo

    with tempfile.TemporaryDirectory(prefix="coordl-demo-") as tmp:
        root = data or os.path.join(tmp, "data")
        run_demo(root, images, batch_size, workers, epochs, make=data is None)


main.add_command(cli_cache.cache_group)
main.add_command(cli_cache.cleanup_cmd)
main.add_command(cli_serve.serve_cmd)
main.add_command(cli_serve.status_cmd)
main.add_command(cli_profile.profile_cmd)
main.add_command(cli_cachenode.cache_node_group)


if __name__ == "__main__":
    main()
