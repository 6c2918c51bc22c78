"""coordl/names.py: one module of names, read by the CLI's choices and by every check."""

from __future__ import annotations

import pathlib

import click
import pytest

from coordl import names
from coordl.cli import profile as profile_cli
from coordl.cli import serve as serve_cli
from coordl.coordinator import config
from coordl.errors import ConfigError
from coordl.pipelines import names as pipeline_names


def _choices(command: click.Command) -> dict[str, tuple[str, ...]]:
    return {p.name: tuple(p.type.choices) for p in command.params if isinstance(p.type, click.Choice)}


def test_serve_choices_are_the_names():
    assert _choices(serve_cli.serve_cmd) == {
        "transform": names.TRANSFORMS, "on_error": names.ON_ERROR,
        "backend": names.BACKENDS, "dali_device": names.DALI_DEVICES}


def test_profile_device_choice_is_the_name():
    assert _choices(profile_cli.profile_cmd)["device"] == names.PROFILE_DEVICES


def test_one_definition_shared_with_the_pipelines():
    assert names.TRANSFORMS is pipeline_names.TRANSFORMS == ("train", "val")
    assert names.DALI_DEVICES is pipeline_names.DALI_DEVICES == ("cpu", "gpu")
    assert config.BACKENDS is names.BACKENDS and config.DALI_DEVICES is names.DALI_DEVICES
    assert names.ON_ERROR == ("raise", "skip") and names.BACKENDS == ("cpu", "dali")


@pytest.mark.parametrize("field,value", [("transform", "test"), ("on_error", "ignore")])
def test_the_daemon_config_refuses_what_the_names_lack(field, value):
    with pytest.raises(ConfigError, match=value):
        config.ServeConfig(**{"data": "/nonexistent", "batch_size": 4, field: value})


def test_no_tuple_of_names_written_out_elsewhere():
    root = pathlib.Path(__file__).resolve().parents[2]
    spelled = ['("train", "val")', '["train", "val"]', '("raise", "skip")', '["raise", "skip"]',
               '("cpu", "dali")', '["cpu", "dali"]', '("cpu", "gpu")', '["cpu", "gpu"]']
    files = [p for d in ("coordl", "cache") for p in (root / d).rglob("*.py")]
    files += [root / "pipelines" / "dali.py"]
    hits = sorted(str(p.relative_to(root)) for p in files if p.name != "names.py"
                  and any(s in p.read_text() for s in spelled))
    assert hits == []
