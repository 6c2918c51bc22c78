"""`import coordl` and the CLI's cache/cleanup/status commands do not import torch (PEP 562)."""

import subprocess
import sys


def test_cli_cache_commands_do_not_import_torch():
    code = ("import sys, coordl, coordl.cli.commands; from click.testing import CliRunner; "
            "r = CliRunner().invoke(coordl.cli.commands.main, ['cache', 'ls']); "
            "assert r.exit_code == 0, r.output; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_lazy_attributes_resolve():
    import coordl
    assert coordl.DataLoader.__module__ == "coordl.loader.dataloader"
    assert "DataLoader" in dir(coordl) and coordl.__version__
    try:
        coordl.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("unknown attribute did not raise")


def test_coordl_status_does_not_import_torch(tmp_path):
    # no daemon there: the command fails with a clear error, and got there without torch
    code = ("import sys; from coordl.cli import main; from click.testing import CliRunner; "
            f"r = CliRunner().invoke(main, ['status', '--socket', {str(tmp_path / 'none.sock')!r}]); "
            "assert r.exit_code != 0 and 'none.sock' in r.output, r.output; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
