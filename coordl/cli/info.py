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
        "c extensions": _extensions(),
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


def _extensions() -> str:
    """The optional C extensions setup.py builds, and what runs where one is missing."""
    from coordl.manifest import walk as manifest_scan
    from coordl.pipelines import roi

    parts = ["ROI JPEG decoder " + ("built" if roi.AVAILABLE else "NOT built (JPEGs decode with Pillow only)"),
             "scan stat " + ("built" if manifest_scan._statnames is not None else "NOT built (statx via ctypes)")]
    missing = not roi.AVAILABLE or manifest_scan._statnames is None
    return ", ".join(parts) + (": run install.sh (needs cc, Python.h, jpeglib.h)" if missing else "")


def _shm_free() -> str:
    from coordl.cache import shm, sizes

    try:
        return f"{shm.SHM_DIR} {sizes.fmt_bytes(shm.free_bytes())} free"
    except OSError:
        return f"{shm.SHM_DIR} missing"
