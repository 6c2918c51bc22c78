"""Elastic resume through a Lightning checkpoint: `ElasticResume`, a Lightning callback.

A coordl.DataLoader state of another world size loads into the new job's loader
(coordl/loader/elastic.py): its ranks read the rest of the epoch, re-split. Lightning,
though, counts the epoch itself: it takes the epoch's length from ``len(loader)`` (a whole
epoch's share of a rank of the new world) and restores its own count of the batches run
(``epoch_loop.batch_progress``), then ends the epoch when the count reaches the length.
Grow the world and the rest is longer than ``length - count``: the epoch ends before the
new ranks have read it; shrink it and the loader runs out first (the epoch still ends, at
a lower batch_idx).

`ElasticResume.on_load_checkpoint` runs before Lightning restores its loops and rewrites
their per-epoch count in the checkpoint so that it agrees with the loader: a rank of the
new world has ``left`` batches of the epoch to go (coordl's own arithmetic), so the count
becomes ``length - left``. Only the *current* (this epoch's) counters of the batch
progress move, all by the same amount, which keeps the stage Lightning restarts at
(after a training batch, after validation); then come plain epochs. Nothing else changes:
``global_step``, the optimizer's and the schedulers' progress and the logger's step count
the steps actually taken (by both jobs), so they are not ``epoch * length + batch_idx`` of
an uninterrupted run. ``batch_idx`` in the resumed epoch counts in the new world's batches
(the first is ``length - left``), and so does what reads it: ``val_check_interval``, a
step scheduler's ``frequency``, ``accumulate_grad_batches`` windows.

Lightning is imported by this module only: ``coordl.ElasticResume`` imports it when used.
For ``pytorch_lightning`` (the older package name, whose Callback class differs), call
`rewrite_progress(checkpoint, trainer.world_size, trainer.limit_train_batches)` from your
LightningModule's ``on_load_checkpoint``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from coordl.epochs import resume
from coordl.errors import ConfigError
from coordl.loader import elastic

_WHERE = "checkpoint['loops']['fit_loop']"


def epoch_left(state: Any, world_size: int) -> tuple[int, int]:
    """(batches per epoch, batches of the resumed epoch still to run) of one rank of a loader
    of `world_size` ranks that loads `state` (a state of coordl's own plan, any world size).
    Every rank has the same: shares are padded to one size, as `DistributedSampler` pads."""
    if not resume.is_dict(state) or not resume.is_dict(state.get("identity")):
        raise ConfigError(f"ElasticResume: {_WHERE}['state_dict']['combined_loader'] holds "
                          f"{type(state).__name__}, not a coordl.DataLoader state: resume from a checkpoint "
                          "of a Trainer that trained with coordl.DataLoader")
    identity: resume.JSONDict = dict(state["identity"], world_size=world_size)
    point = elastic.resume_point(state, identity)  # checks every field; ConfigError naming it
    items, batch_size, drop_last = identity["items"], identity["batch_size"], identity["drop_last"]
    length = elastic.share_batches(items, world_size, batch_size, drop_last)
    if point.epoch != state["epoch"]:  # the epoch holds nothing more for this world's ranks
        return length, 0
    rest = items if point.rest is None else len(point.rest)
    return length, elastic.share_batches(rest, world_size, batch_size, drop_last) - point.skip


def _limited(length: int, limit: int | float | None) -> int:
    """The batches per epoch Lightning runs of a loader of `length` (its limit_train_batches)."""
    if limit is None:
        return length
    return min(length, limit) if isinstance(limit, int) else int(length * limit)


def rewrite_progress(checkpoint: dict[str, Any], world_size: int,
                     limit_train_batches: int | float | None = 1.0) -> int | None:
    """Make a Lightning checkpoint's count of the epoch's batches agree with the coordl loader
    state it holds, for a job of `world_size` ranks: the count becomes ``length - left``
    (`epoch_left`). Returns that count, or None when there is nothing to rewrite (no coordl
    state, a state of this world size that no elastic resume made, an epoch Lightning ended).
    ConfigError when the loader state or the trainer's settings cannot be resumed elastically."""
    loops = checkpoint.get("loops")
    fit_loop = loops.get("fit_loop") if isinstance(loops, dict) else None
    if not isinstance(fit_loop, dict):
        return None  # a checkpoint without loops (weights only): Lightning starts afresh
    states = fit_loop.get("state_dict", {}).get("combined_loader") or []
    elastic_states = [s for s in states if resume.is_dict(s) and resume.is_dict(s.get("identity"))
                      and (s["identity"].get("world_size") != world_size or s.get("consumed"))]
    if not elastic_states:
        return None
    if len(states) != 1:
        raise ConfigError(f"ElasticResume: the checkpoint holds the states of {len(states)} training loaders; an "
                          f"elastic resume (saved with world_size {elastic_states[0]['identity'].get('world_size')}, "
                          f"resumed with {world_size}) re-splits one loader's epoch: train with one "
                          "coordl.DataLoader, or resume with the world size that saved the checkpoint")
    progress = fit_loop["epoch_loop.batch_progress"]
    if progress["is_last_batch"]:
        return None  # Lightning ends this epoch on restart; the loader's state moves on to the next
    length, left = epoch_left(states[0], world_size)
    if _limited(length, limit_train_batches) != length:
        raise ConfigError(f"ElasticResume: limit_train_batches={limit_train_batches!r} cuts each epoch to "
                          f"{_limited(length, limit_train_batches)} of the loader's {length} batches; an elastic "
                          "resume re-splits the rest of a whole epoch: train without limit_train_batches, or "
                          "resume with the world size that saved the checkpoint")
    current = progress["current"]
    shift = length - left - current["ready"]
    for key in current:  # ready, started, processed, completed: this epoch's, all by the same
        current[key] += shift
    if left == 0:  # as a checkpoint saved at the epoch's last batch: Lightning goes on to the next
        progress["is_last_batch"] = True
    return length - left


class ElasticResume(Callback):
    """Resume a Lightning checkpoint with another number of ranks (a coordl.DataLoader over
    coordl's own plan, ``use_distributed_sampler=False``): the resumed epoch runs exactly
    the batches the new ranks have left of it, then plain epochs.

        trainer = L.Trainer(devices=6, strategy="ddp", use_distributed_sampler=False,
                            callbacks=[coordl.ElasticResume(), ModelCheckpoint(...)])
        trainer.fit(model, ckpt_path="saved-by-8-ranks.ckpt")

    Without it a grown world ends the resumed epoch early (Lightning counts the epoch
    itself); with the world size that saved the checkpoint it changes nothing."""

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        rewrite_progress(checkpoint, trainer.world_size, trainer.limit_train_batches)
