"""The names coordl accepts, in one place; the CLI's choices and every check read them here.

Transforms and DALI devices are the pipelines' own (pipelines/names.py: pipelines/ imports
nothing of coordl but the error tree), re-exported so the rest of coordl reads one module.
"""

from __future__ import annotations

from coordl.pipelines.names import DALI_DEVICES, TRANSFORMS

#: ImageFolder(on_error=...), ``coordl serve --on-error``: a bad file raises, or is counted and skipped
ON_ERROR = ("raise", "skip")
#: DataLoader(backend=...), ``coordl serve --backend``: coordl's CPU pipeline, or NVIDIA DALI
BACKENDS = ("cpu", "dali")
#: ``coordl profile --device``: the torch device the profiled model trains on
PROFILE_DEVICES = ("cpu", "cuda")

__all__ = ["BACKENDS", "DALI_DEVICES", "ON_ERROR", "PROFILE_DEVICES", "TRANSFORMS"]
