"""`coordl serve` whose prep workers hit a bug at one item, for the test that an internal error
reaches the job as a `CoordinatorError` with the worker's traceback, never as a `SampleError`:
`ImageFolder.prep_into` raises a RuntimeError at item BUG_ITEM (the file itself is fine).

    python failing_worker_serve.py serve --data DIR --batch-size 4 ...   (the `coordl` arguments)
"""

import sys

from coordl.cli import commands as cli
from coordl.datasets.imagefolder import ImageFolder

BUG_ITEM = 5
_prep_into = ImageFolder.prep_into


def prep_into(self, raw, i, epoch, out):
    if i == BUG_ITEM:
        raise RuntimeError(f"a bug in prep_into at item {i}, forced by the test")
    return _prep_into(self, raw, i, epoch, out)


ImageFolder.prep_into = prep_into  # the daemon's workers are forked: they inherit the patch

if __name__ == "__main__":
    sys.exit(cli.main())
