"""`coordl serve --data s3://...` and `coordl profile --data s3://...` against this module's moto
server: the daemon builds its ImageFolder from the URL (options from --storage-options), jobs get
the local copy's pixels, and the secret appears in no output, log, status or JSON."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
import torch

import coordl
from coordl.coordinator.client import status

COORDL = os.path.join(os.path.dirname(sys.executable), "coordl")
SECRET = "sEcReT-not-to-be-shown-42"


def _options(s3) -> str:
    return json.dumps(s3.options(secret=SECRET))  # moto without auth takes any secret


def test_serve_builds_its_dataset_from_an_s3_url(s3):
    sockdir = tempfile.mkdtemp(prefix="cdl-", dir="/tmp")
    sock, log = os.path.join(sockdir, "s.sock"), os.path.join(sockdir, "s.err")
    argv = [COORDL, "serve", "--data", s3.url, "--storage-options", _options(s3), "--batch-size", "4",
            "--size", "32", "--seed", "5", "--socket", sock, "--workers", "2", "--join-window", "0"]
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        assert "listening" in line, open(log).read()
        remote = coordl.ImageFolder(s3.url, transform="train", size=32, seed=5, storage_options=s3.options())
        local = coordl.ImageFolder(s3.root, transform="train", size=32, seed=5)
        loader = coordl.DataLoader(remote, batch_size=4, shuffle=True, coordinator="unix://" + sock, timeout=60)
        seen = 0
        for batch in loader:
            for row, item in enumerate(batch.indices.tolist()):
                assert torch.equal(batch.images[row], local.prep(local.fetch(item), item, 0)[0])
                seen += 1
            if seen >= len(remote):
                break
        st = status(sock)
        assert st["data"] == s3.url and SECRET not in json.dumps(st)
        loader.coordinator.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        out = line + proc.stdout.read()
        proc.stdout.close()
        text = open(log).read()
        shutil.rmtree(sockdir, ignore_errors=True)
    assert seen == len(remote) and SECRET not in out + text


def test_profile_runs_on_an_s3_url(s3, tmp_path):
    out = tmp_path / "p.json"
    p = subprocess.run([COORDL, "profile", "--data", s3.url, "--storage-options", _options(s3), "--model",
                        "small-cnn", "--batch-size", "4", "--workers", "1", "--steps", "1", "--json", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    assert d["settings"]["dataset"] == s3.url and "fetch stall" in p.stdout
    assert SECRET not in p.stdout + p.stderr + out.read_text()


def test_bad_storage_options_json_is_named(s3, tmp_path):
    p = subprocess.run([COORDL, "profile", "--data", s3.url, "--storage-options", "{nope", "--model", "small-cnn"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "--storage-options is not JSON" in p.stderr


@pytest.mark.parametrize("command", ["serve", "profile"])
def test_missing_bucket_is_named_by_the_command(s3, tmp_path, command):
    extra = (["--batch-size", "4", "--socket", str(tmp_path / "s.sock")] if command == "serve"
             else ["--model", "small-cnn"])
    p = subprocess.run([COORDL, command, "--data", "s3://nope/train", "--storage-options", _options(s3), *extra],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "s3://nope/train: bucket 'nope' does not exist" in p.stderr
    assert SECRET not in p.stdout + p.stderr
