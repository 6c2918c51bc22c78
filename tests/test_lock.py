"""requirements/lock-py<X.Y>.txt pins what install.sh installs: every dependency setup.cfg declares
for the extras install.sh asks for is pinned there, within its range, and this venv holds exactly
the pinned versions. A user's `pip install coordl` still gets ranges (setup.cfg pins nothing)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from setuptools.config.setupcfg import read_configuration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = os.path.join(ROOT, "requirements", f"lock-py{sys.version_info[0]}.{sys.version_info[1]}.txt")
# pillow-simd provides the `PIL` module in place of Pillow (install.sh builds it; setup.cfg names
# plain Pillow only in its `pillow` extra)
PROVIDES = {"pillow": "pillow-simd"}


def _extras_of_install_sh() -> list[str]:
    text = open(os.path.join(ROOT, "install.sh")).read()
    return re.search(r"^EXTRAS='([a-z,]+)'", text, re.M).group(1).split(",")


def read_lock(path: str) -> dict[str, str]:
    """{canonical name: version} of a lock file's `name==version` lines."""
    pins = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"{path}: {line!r} is not name==version"
            pins[canonicalize_name(name)] = version
    return pins


def unpinned(setup_cfg: str, extras: list[str], pins: dict[str, str]) -> list[str]:
    """The requirements of `setup_cfg` (install_requires and `extras`) that `pins` lacks or holds
    outside their range, as 'name (why)'."""
    options = read_configuration(setup_cfg)["options"]
    reqs = list(options["install_requires"])
    for extra in extras:
        reqs += options["extras_require"][extra]
    bad = []
    for req in map(Requirement, reqs):
        name = canonicalize_name(req.name)
        got = pins.get(name) or pins.get(PROVIDES.get(name, ""))
        if got is None:
            bad.append(f"{req.name} (not in the lock)")
        elif name in pins and not req.specifier.contains(Version(got), prereleases=True):
            bad.append(f"{req.name} ({got} outside {req.specifier})")
    return bad


def test_every_declared_dependency_is_pinned_in_the_lock():
    assert unpinned(os.path.join(ROOT, "setup.cfg"), _extras_of_install_sh(), read_lock(LOCK)) == []


def test_a_dependency_missing_from_the_lock_is_found(tmp_path):
    cfg = open(os.path.join(ROOT, "setup.cfg")).read()
    cfg = cfg.replace("    xxhash>=3.0\n", "    xxhash>=3.0\n    leftpad-nowhere>=1.0\n    numpy>=999\n", 1)
    (tmp_path / "setup.cfg").write_text(cfg)
    (tmp_path / "coordl").mkdir()
    (tmp_path / "coordl" / "_version.py").write_text("__version__ = '0'\n")
    (tmp_path / "README.md").write_text("")
    here = os.getcwd()
    os.chdir(tmp_path)                                          # attr: and file: resolve from here
    try:
        bad = unpinned(str(tmp_path / "setup.cfg"), _extras_of_install_sh(), read_lock(LOCK))
    finally:
        os.chdir(here)
    assert bad == ["leftpad-nowhere (not in the lock)", f"numpy ({read_lock(LOCK)['numpy']} outside >=999)"]


def test_users_get_ranges_not_pins():
    options = read_configuration(os.path.join(ROOT, "setup.cfg"))["options"]
    assert not [r for r in options["install_requires"] if "==" in r]


def test_this_venv_holds_the_locked_versions():
    """What install.sh installed is the lock, no more resolved on top (a moved dependency shows here)."""
    wrong = []
    for name, version in read_lock(LOCK).items():
        if name == "pillow":                                    # plain Pillow: the side folder only
            continue
        try:
            got = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name} (locked {version}, not installed)")
            continue
        if got.split("+")[0] != version:
            wrong.append(f"{name} (locked {version}, installed {got})")
    assert wrong == [], "run bash install.sh (or bash install.sh --lock to move the lock)"
