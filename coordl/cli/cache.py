"""`coordl cache ls|drop` and `coordl cleanup`.

`cleanup` runs every function in `CLEANERS`; each takes the shared-memory
folder and returns what it removed (`coordl.cache.shm.Removed`: kind and path).
A component that leaves segments behind when killed adds its own cleaner with
one line: ``CLEANERS.append(f)`` (or an entry in the list below). Cleaners
remove only what is dead; warm MinIO caches whose creator has exited are kept
(a cache outlives its loader) unless ``--caches`` is given (`admin.cleanup`).
Every cleaner leaves other users' segments alone; `cleanup` and `cache drop
--all` list them as skipped, `cache ls` lists them as another user's.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import click

from coordl.cache import shm
from coordl.cache.minio import admin
from coordl.cache.sizes import fmt_bytes
from coordl.coordinator.cleanup import cleanup as coordinator_cleanup

#: cleaner(directory) -> what it removed; run in order by `coordl cleanup` (dead things only).
CLEANERS: list[Callable[[str], list[shm.Removed]]] = [
    admin.cleanup_half_built,  # cache segments whose builder died before publishing them
    coordinator_cleanup,  # ring segments (and socket files) of coordinator daemons that are gone
]

_DIR = click.option("--dir", "directory", default=shm.SHM_DIR, show_default=True,
                    type=click.Path(file_okay=False),
                    help="Shared-memory folder (default: $COORDL_SHM_DIR, else /dev/shm).")


@click.group("cache")
def cache_group() -> None:
    """The node-wide MinIO caches in shared memory."""


@cache_group.command("ls")
@_DIR
def ls_cmd(directory: str) -> None:
    """Each cache: dataset, capacity, fill, memory taken, items, creator and attached processes."""
    infos, theirs, bad = admin.list_caches(directory), admin.foreign(directory), admin.unreadable(directory)
    if not infos and not theirs and not bad:
        click.echo(f"no coordl cache in {directory}")
        return
    for c in infos:
        fill = 100.0 * c.cached_bytes / c.capacity if c.capacity else 0.0
        creator = f"{c.creator_pid} ({'alive' if c.creator_alive else 'dead'})"
        stale = "  (stale: superseded by a newer cache of this root; `coordl cleanup --caches` removes it)"
        click.echo(f"{c.name}{stale if c.stale else ''}\n  dataset     {c.fingerprint[:16]}  {c.label}\n"
                   f"  capacity    {fmt_bytes(c.capacity)}\n"
                   f"  fill        {fmt_bytes(c.cached_bytes)} ({fill:.1f}%)\n"
                   f"  memory      {_memory(directory, c.name)}\n"
                   f"  items       {c.items} of {c.n_items}\n"
                   f"  creator     {creator}\n"
                   f"  attached    {', '.join(map(str, c.attached)) or 'none'}"
                   + (f"\n  corrupt     {c.corrupt} (served from storage)" if c.corrupt else ""))
    for f in theirs:
        click.echo(f"{f.name}  (another user's: {f.owner}, {fmt_bytes(f.size)}; left alone)")
    for name, why in bad:
        click.echo(f"{name}  (unreadable: {why})")


@cache_group.command("drop")
@click.argument("name", required=False)
@click.option("--all", "drop_all", is_flag=True, help="Drop every coordl cache in the folder.")
@_DIR
def drop_cmd(name: str | None, drop_all: bool, directory: str) -> None:
    """Remove cache NAME (segment name or fingerprint prefix), or --all of them."""
    if (name is None) == (not drop_all):
        raise click.UsageError("give a cache NAME (see `coordl cache ls`) or --all, not both")
    names = admin.drop_all(directory) if drop_all or name is None else [admin.drop(directory, name)]
    for n in names:
        click.echo(f"dropped {n}")
    skipped = _skipped(directory, shm.PREFIX) if drop_all else 0
    if not names and not skipped:
        click.echo(f"no coordl cache in {directory}")


@click.command("cleanup")
@click.option("--caches", is_flag=True,
              help="Also remove MinIO caches that nothing is attached to and whose creator has exited "
                   "or that a newer cache of their dataset root superseded. Without it they are kept: "
                   "a cache outlives its loader, so the next job over the dataset hits at once.")
@_DIR
def cleanup_cmd(caches: bool, directory: str) -> None:
    """Remove what dead coordl processes left: coordinator rings and sockets, half-built caches
    (and, with --caches, the MinIO caches nothing uses)."""
    removed = [r for cleaner in CLEANERS for r in cleaner(directory)]
    if caches:
        removed += admin.cleanup(directory)
    for r in removed:
        where = os.path.dirname(r.path)
        click.echo(f"removed {os.path.basename(r.path) if where == directory else r.path}  ({r.kind})")
    skipped = _skipped(directory, shm.COORDL_PREFIX)
    click.echo(f"cleanup: {summary(removed, directory)}" + (f"; skipped {skipped} of other users" if skipped else ""))
    kept = [] if caches else admin.removable(directory)
    if kept:
        held = fmt_bytes(sum(c.cached_bytes for c in kept))
        click.echo(f"kept {_count(len(kept), admin.CACHE)} nothing is attached to ({held} cached): a cache "
                   "outlives its loader; `coordl cleanup --caches` removes them")


def summary(removed: list[shm.Removed], directory: str) -> str:
    """What was removed, counted by kind and folder: "removed 1 coordinator segment from /dev/shm,
    1 coordinator socket from /run/user/1000" (or "removed nothing from /dev/shm")."""
    if not removed:
        return f"removed nothing from {directory}"
    counts = Counter((r.kind, os.path.dirname(r.path)) for r in removed)
    return "removed " + ", ".join(f"{_count(n, kind)} from {where}" for (kind, where), n in counts.items())


def _count(n: int, kind: str) -> str:
    return f"{n} {kind}{'' if n == 1 else 's'}"


def _memory(directory: str, name: str) -> str:
    """What the segment takes in the folder now: its index and the cached items' pages (the
    arena is allocated as it fills, see coordl.cache.minio.cache NOTE [capacity])."""
    try:
        return fmt_bytes(os.stat(os.path.join(directory, name)).st_blocks * 512)
    except FileNotFoundError:
        return "gone (dropped meanwhile)"


def _skipped(directory: str, prefix: str) -> int:
    """Say which of the segments another user owns were left alone; how many."""
    theirs = admin.foreign(directory, prefix)
    for f in theirs:
        click.echo(f"skipped {f.name}: another user's ({f.owner}), left alone")
    return len(theirs)
