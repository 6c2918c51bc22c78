"""Exact mid-epoch resume: what `DataLoader.state_dict()` saves and what it checks on load.

The state is small, versioned and JSON-serialisable. It counts the batches
the training loop *received* in the epoch under way (coordl/loader/iterators.py),
never what workers prefetched, and it names what the remaining batches depend
on, so that a state cannot be loaded into a loader that would yield other
batches:

    {"version": 1 | 2, "epoch": 3, "batches": 17, "rank": 1 | null,
     "identity": {"dataset": "<fingerprint or type>", "items": 50000, "seed": 0,
                  "batch_size": 256, "drop_last": false, "shuffle": true,
                  "world_size": 3},
     "sampler": null | {"seed": 12345} | {"generator_state": "<base64>"},
     "consumed": [{"world_size": 2, "batches": [40, 38]}, ...]}

``consumed`` lists what earlier jobs of another world size read of this epoch before
this one resumed it (elastic resume, coordl/loader/elastic.py); it is [] otherwise. A
state with stages there is version 2, so that a coordl without elastic resume refuses it
rather than misreading it; the others stay version 1 (a state without ``rank`` and
``consumed``, as saved before, reads as rank unknown and nothing consumed).

For a coordl dataset the rest of the epoch is a pure function of (seed, epoch)
(coordl/epochs/sampling.py, pipelines/crop.py item_rng), so resuming is exact for any
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
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import torch

from coordl.errors import ConfigError

VERSION = 1          # a state as any coordl since resume began reads it
ELASTIC_VERSION = 2  # a state with ``consumed`` stages: a coordl before elastic resume refuses it
_READS = (VERSION, ELASTIC_VERSION)

# A state, or a part of it (identity, sampler, a consumed stage), as JSON gives it back:
# string keys, values of any JSON type until a check_* below has looked at them.
JSONDict = dict[str, Any]


def is_dict(value: object) -> TypeGuard[JSONDict]:
    """Whether `value` is a dict: a JSON object (its keys are strings, its values anything)."""
    return isinstance(value, dict)


def is_list(value: object) -> TypeGuard[list[Any]]:
    """Whether `value` is a list: a JSON array (its items anything)."""
    return isinstance(value, list)


def make_state(identity: JSONDict, epoch: int, batches: int, sampler: JSONDict | None,
               rank: int | None = None, consumed: Sequence[Mapping[str, Any]] | None = None) -> JSONDict:
    return {"version": ELASTIC_VERSION if consumed else VERSION, "epoch": int(epoch),
            "batches": int(batches), "rank": rank,
            "identity": dict(identity), "sampler": sampler, "consumed": list(consumed or [])}


_FIX = "pass what loader.state_dict() returned, unchanged (JSON round trips are fine)"
_SEED_RANGE = (-2**63, 2**64 - 1)  # what torch.Generator.manual_seed accepts
_GENERATOR_STATE_BYTES = 5056       # torch's CPU generator state (torch.Generator().get_state())


def check_int(field: str, value: Any, low: int, high: int | None = None, why: str = "") -> int:
    """`value` if it is an int (not a bool) in [low, high], else ConfigError naming the field."""
    top = "" if high is None else f" and <= {high}{why}"
    if type(value) is not int or value < low or (high is not None and value > high):
        raise ConfigError(f"load_state_dict: {field}={value!r} ({type(value).__name__}) must be an "
                          f"int >= {low}{top}: {_FIX}")
    return value


def same_json(saved: Any, value: Any) -> bool:
    """Equal and of the same JSON type (True is not 1, 1.0 is not 1)."""
    return type(saved) is type(value) and saved == value


def _check_identity(saved: Any, identity: JSONDict, elastic: bool = False) -> None:
    if not is_dict(saved):
        raise ConfigError(f"load_state_dict: identity={saved!r} ({type(saved).__name__}) must "
                          f"be a dict with the keys {sorted(identity)}: {_FIX}")
    if elastic:  # another world size is fine: the epoch is re-split (coordl/loader/elastic.py)
        check_int("identity['world_size']", saved.get("world_size"), 1)
    diffs = [f"{k}: saved {saved.get(k, '<missing>')!r}, this loader {v!r}"
             for k, v in identity.items() if not (elastic and k == "world_size") and not same_json(saved.get(k), v)]
    if not elastic and "world_size" in identity and not same_json(saved.get("world_size"), identity["world_size"]):
        diffs.append("a state of another world size loads only into a loader over coordl's own plan "
                     "(a coordl dataset without your own sampler or generator)")
    if diffs:
        raise ConfigError("load_state_dict: the state comes from a loader that yields other batches ("
                          + "; ".join(diffs) + "): build the loader as the saved one was built, "
                          "or start the epoch afresh without load_state_dict")


def _check_sampler(saved: Any) -> JSONDict | None:
    """None, {"seed": int} or {"generator_state": base64 of a torch CPU generator's state}."""
    if saved is None:
        return None
    if is_dict(saved) and set(saved) == {"seed"}:
        check_int("sampler['seed']", saved["seed"], *_SEED_RANGE)
        return saved
    if is_dict(saved) and set(saved) == {"generator_state"}:
        raw: Any = saved["generator_state"]
        try:
            size = len(base64.b64decode(raw, validate=True)) if isinstance(raw, str) else -1
        except ValueError:
            size = -1
        if size != _GENERATOR_STATE_BYTES:
            raise ConfigError(f"load_state_dict: sampler['generator_state']={str(raw)[:40]!r} "
                              f"must be base64 of a {_GENERATOR_STATE_BYTES}-byte torch generator "
                              f"state: {_FIX}")
        return saved
    raise ConfigError(f"load_state_dict: sampler={str(saved)[:80]!r} must be null, "
                      f"{{'seed': int}} or {{'generator_state': base64 str}}: {_FIX}")


def check_version(state: Any, where: str = "state") -> None:
    """ConfigError unless `state` is a dict of a version this coordl reads, with its fields."""
    if not is_dict(state) or "version" not in state:
        raise ConfigError(f"load_state_dict: {type(state).__name__} is not a coordl.DataLoader {where}: "
                          "pass what loader.state_dict() returned (a dict, e.g. loaded from JSON), or "
                          "a list of every rank's states")
    if not any(same_json(state["version"], v) for v in _READS):
        raise ConfigError(f"load_state_dict: {where} version {state['version']!r} is not known to this "
                          f"coordl (it reads version {VERSION}, and {ELASTIC_VERSION} for an elastic resume): "
                          "resume with the coordl that saved it")
    missing = [k for k in ("epoch", "batches", "identity") if k not in state]
    if missing:
        raise ConfigError(f"load_state_dict: the {where} has no {', '.join(map(repr, missing))}: {_FIX}")
    if state.get("consumed") and same_json(state["version"], VERSION):
        raise ConfigError(f"load_state_dict: a {where} of version {VERSION} has no consumed stages "
                          f"(consumed={str(state['consumed'])[:60]}): {_FIX}")


def check_state(state: Any, identity: JSONDict, batches_per_epoch: int | None = None,
                elastic: bool = False) -> tuple[int, int, JSONDict | None]:
    """(epoch, batches received, sampler state) of `state`, or ConfigError naming the field.

    Every field is checked for its type and range (a bool is not an int here), `batches`
    against `batches_per_epoch` when the loader knows it (the epoch's last batch received
    is legal: the next epoch follows), and the identity against this loader's. With
    `elastic`, the saved world size may differ and ``consumed`` is left to the caller
    (coordl/loader/elastic.py); without, a state with ``consumed`` stages is refused."""
    check_version(state)
    _check_identity(state["identity"], identity, elastic)
    if not elastic and state.get("consumed"):
        raise ConfigError(f"load_state_dict: consumed={str(state['consumed'])[:80]!r}: this state "
                          "resumes an epoch split by another world size, which only a local "
                          "coordl.DataLoader over coordl's own plan loads (not a coordinated loader, "
                          "nor one with your own sampler)")
    epoch = check_int("epoch", state["epoch"], 0)
    batches = check_int("batches", state["batches"], 0, batches_per_epoch,
                   " (the batches per epoch of this loader)")
    return epoch, batches, _check_sampler(state.get("sampler"))


class SamplerRNG:
    """Records (and on resume restores) the randomness of torch's `RandomSampler` for one epoch.

    Called when the epoch's index stream starts, which is exactly when RandomSampler would
    draw its seed from torch's global RNG, so the global RNG is consumed as under torch.
    """

    def __init__(self, sampler: torch.utils.data.RandomSampler) -> None:
        self.sampler = sampler
        self._own = self._generator() is None   # torch would draw a new seed every epoch
        self.saved: JSONDict | None = None
        self.restore: JSONDict | None = None

    def begin(self) -> None:
        state, self.restore = self.restore, None
        if self._own:
            seed = state["seed"] if state else int(torch.empty((), dtype=torch.int64).random_().item())
            self.sampler.generator = torch.Generator().manual_seed(seed)
            self.saved = {"seed": seed}
            return
        gen = self._generator()
        if gen is None:
            raise ConfigError("RandomSampler.generator was set to None after the coordl.DataLoader was built "
                              "with a generator: keep the sampler's generator, or build a new loader")
        if state:
            gen.set_state(torch.frombuffer(bytearray(base64.b64decode(state["generator_state"])),
                                           dtype=torch.uint8))
        self.saved = {"generator_state": base64.b64encode(gen.get_state().numpy().tobytes()).decode()}

    def _generator(self) -> torch.Generator | None:
        # torch: RandomSampler.generator is assigned in __init__ without an annotation (Unknown to pyright)
        return self.sampler.generator  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
