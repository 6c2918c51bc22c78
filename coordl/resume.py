"""Exact mid-epoch resume: what `DataLoader.state_dict()` saves and what it checks on load.

The state is small, versioned and JSON-serialisable. It counts the batches
the training loop *received* in the epoch under way (coordl/iterators.py),
never what workers prefetched, and it names what the remaining batches depend
on, so that a state cannot be loaded into a loader that would yield other
batches:

    {"version": 1, "epoch": 3, "batches": 17,
     "identity": {"dataset": "<fingerprint or type>", "items": 50000, "seed": 0,
                  "batch_size": 256, "drop_last": false, "shuffle": true,
                  "world_size": 3},
     "sampler": null | {"seed": 12345} | {"generator_state": "<base64>"}}

For a coordl dataset the rest of the epoch is a pure function of (seed, epoch)
(coordl/sampling.py, pipelines/crop.py item_rng), so resuming is exact for any
`num_workers`, cache and rank. For torch's `RandomSampler` (any other dataset
with ``shuffle=True``) the seed torch draws for the epoch is recorded
(`SamplerRNG`) so the same permutation comes back in a fresh process. What
cannot be restored: a user's own random transforms, a user sampler's hidden
random state (a `DistributedSampler` is fine: it is a function of its seed and
epoch), and an `IterableDataset`'s position (it is replayed: the first batches
are read again and dropped).
"""

from __future__ import annotations

import base64
from typing import Any

import torch

from .errors import ConfigError

VERSION = 1


def make_state(identity: dict, epoch: int, batches: int, sampler: dict | None) -> dict:
    return {"version": VERSION, "epoch": int(epoch), "batches": int(batches),
            "identity": dict(identity), "sampler": sampler}


def check_state(state: Any, identity: dict) -> tuple[int, int, dict | None]:
    """(epoch, batches received, sampler state) of `state`, or ConfigError naming what differs."""
    if not isinstance(state, dict) or "version" not in state:
        raise ConfigError(f"load_state_dict: {type(state).__name__} is not a coordl.DataLoader state: "
                          "pass what loader.state_dict() returned (a dict, e.g. loaded from JSON)")
    if state["version"] != VERSION:
        raise ConfigError(f"load_state_dict: state version {state['version']!r} is not known to this "
                          f"coordl (it reads version {VERSION}): resume with the coordl that saved it")
    saved = state.get("identity", {})
    diffs = [f"{k}: saved {saved.get(k)!r}, this loader {v!r}" for k, v in identity.items() if saved.get(k) != v]
    if diffs:
        raise ConfigError("load_state_dict: the state comes from a loader that yields other batches ("
                          + "; ".join(diffs) + "): build the loader as the saved one was built, "
                          "or start the epoch afresh without load_state_dict")
    epoch, batches = state.get("epoch"), state.get("batches")
    if not (isinstance(epoch, int) and epoch >= 0 and isinstance(batches, int) and batches >= 0):
        raise ConfigError(f"load_state_dict: epoch={epoch!r} and batches={batches!r} must be ints >= 0")
    return epoch, batches, state.get("sampler")


class SamplerRNG:
    """Records (and on resume restores) the randomness of torch's `RandomSampler` for one epoch.

    Called when the epoch's index stream starts, which is exactly when RandomSampler would
    draw its seed from torch's global RNG, so the global RNG is consumed as under torch.
    """

    def __init__(self, sampler: torch.utils.data.RandomSampler) -> None:
        self.sampler = sampler
        self._own = sampler.generator is None   # torch would draw a new seed every epoch
        self.saved: dict | None = None
        self.restore: dict | None = None

    def begin(self) -> None:
        state, self.restore = self.restore, None
        if self._own:
            seed = state["seed"] if state else int(torch.empty((), dtype=torch.int64).random_().item())
            self.sampler.generator = torch.Generator().manual_seed(seed)
            self.saved = {"seed": seed}
            return
        gen = self.sampler.generator
        if state:
            gen.set_state(torch.frombuffer(bytearray(base64.b64decode(state["generator_state"])),
                                           dtype=torch.uint8))
        self.saved = {"generator_state": base64.b64encode(gen.get_state().numpy().tobytes()).decode()}
