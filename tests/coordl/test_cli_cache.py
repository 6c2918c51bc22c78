"""`coordl cache ls|drop` and `coordl cleanup`, on caches in a private folder."""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets

import pytest
from click.testing import CliRunner

from coordl.cache import shm
from coordl.cache.minio.cache import MinIOCache
from coordl.cli import cache as cli_cache
from coordl.cli.commands import main

FORK = mp.get_context("fork")


@pytest.fixture
def shm_dir(tmp_path):
    """A folder of our own, so that `drop --all` and `cleanup` touch nobody else's caches."""
    d = tmp_path / "shm"
    d.mkdir()
    return str(d)


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _create_and_exit(directory: str, fingerprint: str) -> None:
    cache = MinIOCache(4096, directory=directory).open(fingerprint, 8, "/data/made-by-child")
    cache.put(0, b"abc")


def _in_child(*args) -> int:
    p = FORK.Process(target=_create_and_exit, args=args)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    return p.pid


def _attached_child(cache: MinIOCache, conn) -> None:
    cache.get(0)          # first use in the forked child registers it
    conn.send("attached")
    conn.recv()


def test_ls_shows_dataset_capacity_fill_items_creator_and_attached(shm_dir):
    fp = secrets.token_hex(32)
    cache = MinIOCache(8192, directory=shm_dir).open(fp, 10, "/data/train")
    cache.put(1, b"x" * 2048)
    cache.put(2, b"y" * 2048)
    parent, child = FORK.Pipe()
    p = FORK.Process(target=_attached_child, args=(cache, child))
    p.start()
    try:
        assert parent.recv() == "attached"
        out = _cli("cache", "ls", "--dir", shm_dir)
    finally:
        parent.send("bye")
        p.join(10)
        cache.drop()
    assert cache.name in out and fp[:16] in out and "/data/train" in out
    assert "capacity    8.0 KiB" in out and "4.0 KiB (50.0%)" in out and "items       2 of 10" in out
    assert "memory      12.0 KiB" in out      # header and index (8 KiB), one page of items
    assert f"creator     {os.getpid()} (alive)" in out
    attached = out.split("attached")[1]
    assert str(os.getpid()) in attached and str(p.pid) in attached
    assert "no coordl cache" in _cli("cache", "ls", "--dir", shm_dir)


def test_drop_by_name_by_fingerprint_and_all(shm_dir):
    caches = [MinIOCache(4096, directory=shm_dir).open(secrets.token_hex(32), 4) for _ in range(3)]
    try:
        assert f"dropped {caches[0].name}" in _cli("cache", "drop", caches[0].name, "--dir", shm_dir)
        assert f"dropped {caches[1].name}" in _cli("cache", "drop", caches[1].fingerprint, "--dir", shm_dir)
        assert caches[0].get(0) is None          # still mapped in this process, and still correct
        out = _cli("cache", "drop", "--all", "--dir", shm_dir)
        assert f"dropped {caches[2].name}" in out and os.listdir(shm_dir) == []
        bad = CliRunner().invoke(main, ["cache", "drop", "nonesuch", "--dir", shm_dir])
        assert bad.exit_code == 2 and "no cache segment 'nonesuch'" in bad.output
        assert CliRunner().invoke(main, ["cache", "drop", "--dir", shm_dir]).exit_code == 2
    finally:
        for c in caches:
            c.drop()


def test_a_warm_cache_survives_plain_cleanup_and_goes_with_caches(shm_dir):
    """A cache outlives its loader: its creator exited, nothing is attached, plain cleanup keeps it
    (and says so); --caches removes it; the summary counts what went, by kind and folder."""
    fp = secrets.token_hex(32)
    _in_child(shm_dir, fp)
    out = _cli("cleanup", "--dir", shm_dir)
    assert os.listdir(shm_dir) == [shm.segment_name(fp)]
    assert f"cleanup: removed nothing from {shm_dir}" in out and "removed coordl-cache" not in out
    assert "kept 1 cache segment nothing is attached to (3 B cached)" in out and "cleanup --caches" in out
    again = MinIOCache(4096, directory=shm_dir).open(fp, 8)
    assert again.get(0) == b"abc"                            # still warm for the next job
    again.close()
    out = _cli("cleanup", "--caches", "--dir", shm_dir)
    assert f"removed {shm.segment_name(fp)}  (cache segment)" in out
    assert f"cleanup: removed 1 cache segment from {shm_dir}" in out and os.listdir(shm_dir) == []
    help_text = _cli("cleanup", "--help")
    assert "--caches" in help_text and "outlives its loader" in help_text


def test_the_summary_names_a_socket_removed_outside_the_folder(shm_dir, tmp_path):
    """A dead daemon's ring in the folder and its socket elsewhere: two kinds, two folders."""
    sock = str(tmp_path / "serve.sock")
    open(sock, "w").close()
    ring = os.path.join(shm_dir, "coordl-serve-1-1-abcdef012345-ring")
    removed = [shm.Removed("coordinator socket", sock), shm.Removed("coordinator segment", ring)]
    assert cli_cache.summary(removed, shm_dir) == (f"removed 1 coordinator socket from {tmp_path}, "
                                                   f"1 coordinator segment from {shm_dir}")
    assert cli_cache.summary(removed + removed[1:], shm_dir).endswith(f"2 coordinator segments from {shm_dir}")


def test_cleanup_removes_only_what_dead_creators_left_unattached(shm_dir):
    orphan, held, live = (secrets.token_hex(32) for _ in range(3))
    _in_child(shm_dir, orphan)                                   # creator dead, nobody attached
    _in_child(shm_dir, held)                                     # creator dead, but ...
    holder = MinIOCache(4096, directory=shm_dir).open(held, 8)   # ... this process is attached
    mine = MinIOCache(4096, directory=shm_dir).open(live, 8)     # creator alive
    # a segment whose builder was killed before publishing it
    p = FORK.Process(target=os.getpid)
    p.start()
    p.join()
    stale_tmp = f"{shm.PREFIX}{orphan[16:32]}.tmp-{p.pid}"
    open(os.path.join(shm_dir, stale_tmp), "wb").close()
    try:
        out = _cli("cleanup", "--dir", shm_dir)                  # dead things only: the half-built file
        assert f"removed {stale_tmp}  (half-built cache segment)" in out
        assert shm.segment_name(orphan) in os.listdir(shm_dir)
        out = _cli("cleanup", "--caches", "--dir", shm_dir)
        left = set(os.listdir(shm_dir))
        assert shm.segment_name(orphan) not in left and f"removed {shm.segment_name(orphan)}" in out
        assert stale_tmp not in left
        assert {shm.segment_name(held), shm.segment_name(live)} <= left
        assert holder.get(0) == b"abc"
        holder.close()                                           # now nothing holds it
        out = _cli("cleanup", "--caches", "--dir", shm_dir)
        assert f"removed {shm.segment_name(held)}" in out
        assert set(os.listdir(shm_dir)) == {shm.segment_name(live)}
    finally:
        holder.drop()
        mine.drop()


def test_cleanup_runs_every_registered_cleaner(shm_dir, monkeypatch):
    extra = [lambda d: [shm.Removed("coordinator segment", os.path.join(d, "coordl-serve-x"))]]
    monkeypatch.setattr(cli_cache, "CLEANERS", cli_cache.CLEANERS + extra)
    out = _cli("cleanup", "--dir", shm_dir)
    assert "removed coordl-serve-x  (coordinator segment)" in out
    assert f"cleanup: removed 1 coordinator segment from {shm_dir}" in out


def test_a_cache_superseded_by_a_new_fingerprint_of_its_root_is_stale_and_cleaned_up(shm_dir):
    old, new, other = (secrets.token_hex(32) for _ in range(3))
    MinIOCache(4096, directory=shm_dir).open(old, 8, "/data/train").close()     # detached, creator alive
    held = MinIOCache(4096, directory=shm_dir).open(secrets.token_hex(32), 8, "/data/val")
    current = MinIOCache(4096, directory=shm_dir).open(new, 9, "/data/train")  # the dataset changed
    newer_val = MinIOCache(4096, directory=shm_dir).open(other, 8, "/data/val")
    try:
        out = _cli("cache", "ls", "--dir", shm_dir)
        stale = [line.split()[0] for line in out.splitlines() if "(stale:" in line]
        assert stale == sorted([shm.segment_name(old), held.name])
        out = _cli("cleanup", "--caches", "--dir", shm_dir)
        assert f"removed {shm.segment_name(old)}" in out and "removed 1 cache segment" in out
        assert set(os.listdir(shm_dir)) == {current.name, held.name, newer_val.name}  # held: attached
        held.close()
        assert f"removed {held.name}" in _cli("cleanup", "--caches", "--dir", shm_dir)
        assert set(os.listdir(shm_dir)) == {current.name, newer_val.name}
        assert "(stale" not in _cli("cache", "ls", "--dir", shm_dir)
    finally:
        for c in (held, current, newer_val):
            c.drop()


def test_a_half_built_segment_is_stale_by_pid_and_start_time_not_by_pid_alone(shm_dir):
    me, start = os.getpid(), shm.proc_start(os.getpid())
    building = f"{shm.PREFIX}{'a' * 16}.tmp-{me}-{start}"       # ours, being built right now
    reused = f"{shm.PREFIX}{'b' * 16}.tmp-{me}-{start - 1}"     # a dead builder whose pid we reuse
    for name in (building, reused):
        open(os.path.join(shm_dir, name), "wb").close()
    assert shm.tmp_name(shm.PREFIX + "a" * 16) == building
    out = _cli("cleanup", "--dir", shm_dir)
    assert f"removed {reused}" in out and building not in out
    assert os.listdir(shm_dir) == [building]


def test_ls_names_a_segment_it_cannot_read_and_drop_removes_it(shm_dir):
    name = shm.segment_name(secrets.token_hex(32))
    with open(os.path.join(shm_dir, name), "wb") as f:
        f.write(b"\0" * 8192)                     # e.g. a segment of an older layout version
    out = _cli("cache", "ls", "--dir", shm_dir)
    assert f"{name}  (unreadable: " in out and f"coordl cache drop {name}" in out
    assert f"dropped {name}" in _cli("cache", "drop", name, "--dir", shm_dir)
    assert os.listdir(shm_dir) == []
