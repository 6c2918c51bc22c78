"""What `coordl info` reports: versions and which image backends are active."""

from __future__ import annotations

import os
import platform


def pillow_build() -> str:
    import PIL
    from PIL import features

    simd = ".post" in PIL.__version__
    turbo = features.check_feature("libjpeg_turbo")
    return (f"{'pillow-simd' if simd else 'Pillow'} {PIL.__version__}"
            f"{' (SIMD build)' if simd else ' (plain, no SIMD: run install.sh for pillow-simd)'}"
            f", libjpeg-turbo {'yes' if turbo else 'no'}")


def collect() -> dict[str, str]:
    import numpy
    import torch

    import coordl

    facts = {
        "coordl": coordl.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "pillow": pillow_build(),
        "cpus": f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()}",
        "shm": _shm_free(),
    }
    try:
        import nvidia.dali as dali

        facts["dali"] = dali.__version__
    except ImportError:
        facts["dali"] = "not installed (pip install 'coordl[dali]')"
    try:
        import redis

        facts["redis-py"] = redis.__version__
    except ImportError:
        facts["redis-py"] = "not installed (pip install 'coordl[redis]')"
    return facts


def _shm_free() -> str:
    from coordl.cache import shm

    try:
        return f"{shm.SHM_DIR} {shm.fmt_bytes(shm.free_bytes())} free"
    except OSError:
        return f"{shm.SHM_DIR} missing"
