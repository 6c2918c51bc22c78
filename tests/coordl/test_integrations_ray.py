"""coordl.integrations.ray without a Ray cluster: its settings are checked in the driver, its handle
pickles into trials without the driver's parts, and coordl imports without Ray installed. The
searches themselves: tests/integrations/test_ray_tune.py (slow tier)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from coordl.errors import ConfigError, CoordinatorError
from coordl.integrations import ray as coordl_ray


def test_settings_are_checked_before_any_node_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"shared_prep\(sokcet=\): not a daemon setting.*min_jobs"):
        coordl_ray.serve_options(str(tmp_path), 4, sokcet="/x")
    with pytest.raises(ConfigError, match=r"shared_prep\(socket=\).*chosen per node"):
        coordl_ray.serve_options(str(tmp_path), 4, socket="/x")
    with pytest.raises(ConfigError, match="--batch-size 0"):
        coordl_ray.serve_options(str(tmp_path), 0)
    with pytest.raises(ConfigError, match="--slots 1"):
        coordl_ray.serve_options(str(tmp_path), 4, slots=1)


def test_settings_as_every_node_gets_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Tune runs each trial in a folder of its own: a relative folder is made absolute
    fields = coordl_ray.serve_options("data", 4, size=32, cache_bytes="8MiB", min_jobs=4)
    assert fields == {"data": str(tmp_path / "data"), "batch_size": 4, "size": 32, "cache_bytes": 8 * 2**20,
                      "min_jobs": 4}
    assert coordl_ray.serve_options("s3://bucket/train", 4)["data"] == "s3://bucket/train"


def test_a_trials_copy_holds_the_sockets_not_the_driver(tiny_root):
    fields = coordl_ray.serve_options(tiny_root, 4, size=32, seed=3)
    prep = coordl_ray.SharedPrep(fields, [coordl_ray._Daemon("node-a", actor=None, where={"socket": "/s/a.sock"})])
    copy = pickle.loads(pickle.dumps(prep))
    assert copy.addresses == {"node-a": "/s/a.sock"} and copy.config == prep.config
    with pytest.raises(CoordinatorError, match="driver's .* in a trial use loader.stats"):
        copy.status()
    copy.close()  # the driver's to do: nothing here
    # the dataset a trial attaches with is the daemon's (its size, seed: the same samples)
    import coordl

    assert copy.dataset().fingerprint == coordl.ImageFolder(tiny_root, size=32, seed=3).fingerprint
    assert copy.dataset().served_as() == coordl.ImageFolder(tiny_root, size=32, seed=3).served_as()


def test_coordl_imports_without_ray_and_says_how_to_install_it(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
            "import coordl, coordl.integrations.ray as r\n"
            f"try:\n    r.shared_prep({str(tmp_path)!r}, batch_size=4)\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "coordl.integrations.ray needs Ray" in out.stdout and "pip install -e '.[ray]'" in out.stdout
