"""The epochs room: what an epoch is, built on by both the loader and the coordinator.

- `sampling`: the epoch order as a pure function of (seed, epoch), each rank's share, the batches of
  an epoch (`EpochBatch`, with the batch the same worker reads next).
- `resume`: the resume state (`state_dict` / `load_state_dict`): where an epoch was left, checked
  on the way in.

It imports nothing of the loader, the coordinator or the datasets: they import it.
"""
