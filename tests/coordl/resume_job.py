"""A fresh process that resumes coordl.DataLoader states (tests/coordl/test_resume.py).

    python resume_job.py CONFIG.json STATES.json OUT.pt

For each state in STATES.json: a new dataset and loader built from CONFIG,
`load_state_dict(state)`, then the rest of that epoch and one more epoch,
saved as lists of (images, labels) tensors to OUT.pt (torch.save of tensors
only, read back with weights_only=True).
"""

import json
import sys

import torch
from tests_resume_common import build  # noqa: E402  (sys.path[0] is this file's folder)


def main() -> None:
    config, states, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
    runs = []
    for state in states:
        loader = build(config)
        loader.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in loader]
        after = [(x.clone(), y.clone()) for x, y in loader]
        runs.append({"rest": rest, "after": after})
        del loader
    torch.save(runs, out)


if __name__ == "__main__":
    main()
