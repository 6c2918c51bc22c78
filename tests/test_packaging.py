"""The three top-level folders install as one package, `coordl`."""

import importlib.util
import json
import os
import subprocess
import sys

import coordl


def test_only_coordl_is_an_import_name():
    assert importlib.util.find_spec("cache") is None
    assert importlib.util.find_spec("pipelines") is None


def test_subpackages_import_from_their_folders():
    import coordl.cache.storage.localfile
    import coordl.pipelines.cpu

    assert coordl.cache.storage.localfile.__file__.endswith("cache/storage/localfile.py")
    assert coordl.pipelines.cpu.__file__.endswith("pipelines/cpu.py")


def test_console_script_reports_pillow_build():
    exe = os.path.join(os.path.dirname(sys.executable), "coordl")
    assert os.access(exe, os.X_OK), f"no coordl console script beside {sys.executable}"
    out = subprocess.run([exe, "info", "--json"], capture_output=True, text=True, check=True).stdout
    assert '"pillow"' in out and coordl.__version__ in out
    # install.sh builds both optional C extensions (setup.py); info says so
    assert json.loads(out)["c extensions"] == "ROI JPEG decoder built, scan stat built"
