"""Elastic resume: an epoch begun by a job of W ranks, finished by a job of W' ranks. Pure: no I/O.

Position. An epoch's global order is `epoch_order(items, seed, epoch)`; a job of W ranks
splits it as `DistributedSampler` does (coordl/epochs/sampling.py `rank_share`): rank r
reads positions r, r+W, r+2W, ... of the order (the order padded with its head to a
multiple of W, or cut with ``drop_last``), in batches of ``batch_size``. A rank's state
counts the batches its training loop *received* (b_r), so what the job read is known
exactly, position by position:

    read = {(r + j*W) mod items : r < W, j < min(b_r * batch_size, share)}

(a position past the end is DistributedSampler's padding, the head of the order again: that
item counts as read). The rest of the epoch is every position of the order not in ``read``,
in epoch order; the W'-rank job splits that rest the same way (rank r' reads its positions
r', r'+W', ..., padded with the head of the rest). Ranks that stopped at different batches are not
cut back to the slowest: what a rank ahead read stays read. So across the two jobs each
item of the epoch is read exactly once, except the new job's padding of the rest (at most
W'-1 items of its head read a second time) and a padding read of the old job's (an item it
read twice, as an uninterrupted run would). ``drop_last`` drops as it drops in any run: each
job cuts its split to a multiple of its world size and drops incomplete batches. Later
epochs are plain W'-rank epochs.

A job that was itself resumed this way and is stopped again adds a stage: a state's
``consumed`` lists the stages before the one under way (``{"world_size", "batches"}``,
oldest first), and the rest is taken stage by stage.

What loads: `merge_states` of the W states of one job (states[r] saved by rank r; what
``loader.load_state_dict([s0, s1, ...])`` does), exact whatever batch each rank was at. A
lone state of another world size stands for every rank at its batch: what a DDP job is
(its ranks step together) and all a Lightning checkpoint holds (rank 0's state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from coordl.epochs import resume
from coordl.epochs.sampling import share_size
from coordl.errors import ConfigError

_FIX = "pass the states the ranks' loader.state_dict() returned, unchanged, states[r] from rank r"


class Stage(TypedDict):
    """One job's part of an epoch: its world size and the batches each of its ranks received."""

    world_size: int
    batches: list[int]


def share_batches(positions: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Batches one rank reads when `world_size` ranks split `positions` of an order."""
    n = share_size(positions, world_size, drop_last)
    return n // batch_size if drop_last else -(-n // batch_size)


def rest_of_epoch(items: int, stages: list[Stage], batch_size: int, drop_last: bool) -> np.ndarray:
    """The positions of an epoch's order (of `items`) that `stages` did not read, in order.

    Each stage is ``{"world_size": W, "batches": [b_0, ..., b_{W-1}]}``: W ranks split what the
    stages before left, and rank r received b_r batches of its share."""
    rest = np.arange(items, dtype=np.int64)
    for stage in stages:
        world, batches = stage["world_size"], stage["batches"]
        n = share_size(len(rest), world, drop_last)
        read = np.zeros(len(rest), dtype=bool)
        for rank, b in enumerate(batches):
            pos = rank + world * np.arange(min(b * batch_size, n), dtype=np.int64)
            read[pos % max(len(rest), 1)] = True  # beyond the end: padding, the head read again
        rest = rest[~read]
    return rest


def check_stages(value: Any, items: int, batch_size: int, drop_last: bool, where: str = "consumed") -> list[Stage]:
    """`value` as a list of stages, or ConfigError naming the field (types, lengths, ranges)."""
    if not resume.is_list(value):
        raise ConfigError(f"load_state_dict: {where}={str(value)[:80]!r} ({type(value).__name__}) must be "
                          f"a list of {{'world_size': int, 'batches': [int, ...]}}: {_FIX}")
    stages: list[Stage] = []
    left = items
    for i, stage in enumerate(value):
        if not resume.is_dict(stage) or set(stage) != {"world_size", "batches"}:
            raise ConfigError(f"load_state_dict: {where}[{i}]={str(stage)[:80]!r} must be a dict with "
                              f"the keys 'batches' and 'world_size': {_FIX}")
        world = resume.check_int(f"{where}[{i}]['world_size']", stage["world_size"], 1)
        batches = stage["batches"]
        if not resume.is_list(batches) or len(batches) != world:
            raise ConfigError(f"load_state_dict: {where}[{i}]['batches']={str(batches)[:80]} must be a "
                              f"list of {world} ints (one per rank of world_size {world}): {_FIX}")
        top = share_batches(left, world, batch_size, drop_last)
        checked = [resume.check_int(f"{where}[{i}]['batches'][{r}]", b, 0, top, " (the batches of a rank's share)")
                   for r, b in enumerate(batches)]
        stages.append({"world_size": world, "batches": checked})
        left = len(rest_of_epoch(items, stages, batch_size, drop_last))
    return stages


def _identity_fields(identity: resume.JSONDict) -> tuple[int, int, bool]:
    items, batch_size, drop_last = identity.get("items"), identity.get("batch_size"), identity.get("drop_last")
    if type(items) is not int or type(batch_size) is not int or batch_size < 1 or type(drop_last) is not bool:
        raise ConfigError(f"load_state_dict: identity items={items!r}, batch_size={batch_size!r}, "
                          f"drop_last={drop_last!r}: elastic resume needs a map dataset's item count, "
                          f"an int batch_size and a bool drop_last: {_FIX}")
    return items, batch_size, drop_last


def merge_states(states: Any) -> resume.JSONDict:
    """One state standing for every rank of a job: `states[r]` is what rank r's
    ``loader.state_dict()`` returned. Loads into a loader of any world size (exactly: each
    rank's own batch count is used). ConfigError naming the field when the states are not
    the W states of one job at one point."""
    if not resume.is_list(states) or not states:
        raise ConfigError(f"merge_states: {type(states).__name__} must be a non-empty list of the states "
                          f"of every rank: {_FIX}")
    for r, state in enumerate(states):
        resume.check_version(state, f"states[{r}]")
    first = states[0]
    identity = first["identity"]
    if not resume.is_dict(identity):
        raise ConfigError(f"merge_states: states[0]['identity']={identity!r} must be a dict: {_FIX}")
    world = resume.check_int("states[0]['identity']['world_size']", identity.get("world_size"), 1)
    if len(states) != world:
        raise ConfigError(f"merge_states: {len(states)} states of a job of world_size {world}: pass every "
                          f"rank's state, states[r] from rank r ({world} of them)")
    items, batch_size, drop_last = _identity_fields(identity)
    epochs: list[int] = []
    for r, state in enumerate(states):
        for key in sorted(set(identity) | set(state["identity"])):
            if not resume.same_json(state["identity"].get(key), identity.get(key)):
                raise ConfigError(f"merge_states: states[{r}]['identity']['{key}']={state['identity'].get(key)!r}, "
                                  f"states[0]'s is {identity.get(key)!r}: the states come from different "
                                  f"loaders; {_FIX}")
        rank = state.get("rank")
        if rank is not None and not resume.same_json(rank, r):
            raise ConfigError(f"merge_states: states[{r}]['rank']={rank!r}: {_FIX}")
        if state.get("sampler") is not None:
            raise ConfigError(f"merge_states: states[{r}]['sampler']={str(state['sampler'])[:60]!r}: only "
                              "states of coordl's own plan (a coordl dataset, no sampler of yours) merge")
        epochs.append(resume.check_int(f"states[{r}]['epoch']", state["epoch"], 0))
    epoch = min(epochs)
    behind = epochs.index(epoch)  # a rank still in the epoch: its consumed are the stages before
    prior = check_stages(states[behind].get("consumed", []), items, batch_size, drop_last,
                         f"states[{behind}]['consumed']")
    full = share_batches(len(rest_of_epoch(items, prior, batch_size, drop_last)), world, batch_size, drop_last)
    batches: list[int] = []
    for r, state in enumerate(states):
        b = resume.check_int(f"states[{r}]['batches']", state["batches"], 0, full, " (the batches of a rank's share)")
        consumed = state.get("consumed", [])
        if state["epoch"] == epoch and consumed == prior:
            batches.append(b)
        elif state["epoch"] == epoch + 1 and b == 0 and not consumed:
            batches.append(full)  # that rank finished epoch `epoch`: its state moved on to the next
        else:
            raise ConfigError(f"merge_states: states[{r}] is at epoch {state['epoch']}, batch {b} "
                              f"(consumed {str(consumed)[:60]}), states[{behind}] at epoch {epoch}, batch "
                              f"{states[behind]['batches']} (consumed {str(prior)[:60]}): the states of one job saved "
                              f"at one step differ by at most one epoch, the later at its start; {_FIX}")
    stages = prior + ([Stage(world_size=world, batches=batches)] if any(batches) else [])
    return resume.make_state(identity, epoch, 0, None, None, stages)


@dataclass(frozen=True)
class ResumePoint:
    """Where a loader of this world size goes on from a state."""

    epoch: int                 # the epoch the next iter(loader) runs
    skip: int                  # batches of this rank's part of it already received
    rest: np.ndarray | None    # positions of the epoch's order still to read (None: all of it)
    stages: list[Stage]        # what earlier jobs read of it (the state's next ``consumed``)


def resume_point(state: Any, identity: resume.JSONDict) -> ResumePoint:
    """Where a loader over coordl's plan with `identity` (its world size W') goes on from
    `state`: a state of its own world size, a merged one (`merge_states`) or a lone state of
    another world size (every rank taken to be at its batch). ConfigError naming the field."""
    epoch, batches, _ = resume.check_state(state, identity, None, elastic=True)
    items, batch_size, drop_last = _identity_fields(identity)
    stages = check_stages(state.get("consumed", []), items, batch_size, drop_last)
    saved_world, world = state["identity"]["world_size"], identity["world_size"]
    if saved_world != world and batches:  # a lone rank's state: every rank at its batch
        full = share_batches(len(rest_of_epoch(items, stages, batch_size, drop_last)),
                             saved_world, batch_size, drop_last)
        resume.check_int("batches", batches, 0, full, f" (the batches per epoch of a rank of world_size {saved_world})")
        stages, batches = stages + [Stage(world_size=saved_world, batches=[batches] * saved_world)], 0
    rest = rest_of_epoch(items, stages, batch_size, drop_last) if stages else None
    length = share_batches(items if rest is None else len(rest), world, batch_size, drop_last)
    resume.check_int("batches", batches, 0, length, " (the batches per epoch of this loader)")
    if batches >= length:  # this rank's part of the epoch is done: the next epoch, whole
        return ResumePoint(epoch + 1, 0, None, [])
    return ResumePoint(epoch, batches, rest, stages)
