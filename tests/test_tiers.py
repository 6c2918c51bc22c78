"""The tier rules of tests/conftest.py name folders, files and fixtures that exist: a rule whose
file was renamed would silently move its tests back into the fast tier."""

from __future__ import annotations

import os

TESTS = os.path.dirname(os.path.abspath(__file__))


def _rules(config):
    (conftest,) = [p for p in config.pluginmanager.get_plugins() if hasattr(p, "SLOW_FILES")]
    return conftest


def test_every_slow_folder_and_file_exists(request):
    rules = _rules(request.config)
    for folder in rules.SLOW_FOLDERS:
        assert os.path.isdir(os.path.join(TESTS, folder)), f"tests/conftest.py SLOW_FOLDERS: no tests/{folder}"
    for name in rules.SLOW_FILES:
        assert os.path.isfile(os.path.join(TESTS, name)), f"tests/conftest.py SLOW_FILES: no tests/{name}"


def test_every_slow_fixture_is_defined(request):
    defined = ""
    for folder, _dirs, files in os.walk(TESTS):
        if "conftest.py" in files:
            with open(os.path.join(folder, "conftest.py")) as f:
                defined += f.read()
    for name in _rules(request.config).SLOW_FIXTURES:
        assert f"\ndef {name}(" in defined, f"tests/conftest.py SLOW_FIXTURES: no conftest defines {name!r}"
