"""Dataset identity (coordl/manifest/identity.py) and the persisted manifest (coordl/manifest/store.py).

Every tree here is real JPEG files on disk; "a scan" is counted through
coordl.manifest.build.SCANS (walks of the tree, loads of a persisted manifest).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from PIL import Image

import coordl
from coordl.cache import shm
from coordl.manifest import build as manifest
from coordl.manifest import identity as manifest_identity
from coordl.manifest import store as manifest_store


def _jpeg(seed: int, size: int) -> bytes:
    """A real JPEG padded to exactly `size` bytes (decoders stop at EOI: the padding is inert)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, "JPEG", quality=60)
    data = buf.getvalue()
    assert len(data) <= size
    return data + b"\0" * (size - len(data))


def _settle(root: str) -> None:
    """Backdate every folder's mtime past the racy window, as an hour-old dataset has."""
    old = time.time_ns() - 10 * manifest_store.RACY_NS
    for dirpath, _, _ in os.walk(root):
        os.utime(dirpath, ns=(old, old))


def _tree(root: str, seed: int, classes: int = 3, per_class: int = 5, size: int = 4096,
          mtime_ns: int = 1_600_000_000_123_456_789) -> str:
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class_{c}"))
        for k in range(per_class):
            p = os.path.join(root, f"class_{c}", f"img_{k:03d}.jpg")
            with open(p, "wb") as f:
                f.write(_jpeg(seed * 1000 + c * 100 + k, size))
            os.utime(p, ns=(mtime_ns, mtime_ns))
    _settle(root)
    return root


def _rewrite_same_size(path: str, seed: int) -> None:
    """Overwrite a file in place with other bytes of the same size, then put its mtime back."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(_jpeg(seed, st.st_size))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "manifests")


@pytest.fixture
def counted():
    before = dict(manifest.SCANS)
    return lambda: {k: manifest.SCANS[k] - before[k] for k in before}


def _same(a: manifest.Manifest, b: manifest.Manifest) -> bool:
    return (a.fingerprint == b.fingerprint and a.classes == b.classes
            and all(np.array_equal(getattr(a, f), getattr(b, f))
                    for f in ("paths_blob", "path_offsets", "sizes", "mtimes", "labels")))


# -- identity -------------------------------------------------------------------------------

def test_equal_metadata_different_bytes_get_different_fingerprints(tmp_path, store):
    a = _tree(str(tmp_path / "a"), seed=1)
    b = _tree(str(tmp_path / "b"), seed=2)
    ma, mb = manifest.scan(a, manifest_cache=store), manifest.scan(b, manifest_cache=store)
    assert np.array_equal(ma.sizes, mb.sizes) and np.array_equal(ma.mtimes, mb.mtimes)
    assert np.array_equal(ma.paths_blob, mb.paths_blob)
    assert ma.fingerprint != mb.fingerprint


@pytest.mark.parametrize("how", ["rsync -a", "tar", "cp -a"])
def test_a_faithful_copy_under_another_path_keeps_the_fingerprint(tmp_path, store, how):
    src = _tree(str(tmp_path / "src"), seed=3)
    dst = str(tmp_path / "elsewhere" / "copy")
    os.makedirs(os.path.dirname(dst))
    if how == "rsync -a":
        subprocess.run(["rsync", "-a", src + "/", dst + "/"], check=True)
    elif how == "tar":  # GNU tar keeps whole-second mtimes only
        os.makedirs(dst)
        subprocess.run(f"tar cf - -C {src} . | tar xf - -C {dst}", shell=True, check=True)
        assert os.stat(os.path.join(dst, "class_0", "img_000.jpg")).st_mtime_ns % 1_000_000_000 == 0
    else:
        subprocess.run(["cp", "-a", src, dst], check=True)
    m_src, m_dst = manifest.scan(src, manifest_cache=store), manifest.scan(dst, manifest_cache=store)
    assert m_src.root != m_dst.root
    assert m_src.fingerprint == m_dst.fingerprint and m_dst.revision == ""


def test_same_size_edit_with_mtime_restored_gets_a_new_fingerprint(tmp_path, store, counted):
    root = _tree(str(tmp_path / "d"), seed=4)
    first = manifest.scan(root, manifest_cache=store)
    _rewrite_same_size(os.path.join(root, "class_1", "img_002.jpg"), seed=99)
    again = manifest.scan(root, manifest_cache=store)     # a restart: the sample's stat shows it
    assert counted() == {"walks": 2, "loads": 0}
    assert again.fingerprint != first.fingerprint
    assert np.array_equal(again.sizes, first.sizes) and np.array_equal(again.mtimes, first.mtimes)


def test_an_edit_outside_the_sample_is_a_silent_revision_found_by_rescan(tmp_path, store, counted, monkeypatch):
    monkeypatch.setattr(manifest_identity, "SAMPLE_FILES", 4)
    root = _tree(str(tmp_path / "d"), seed=5, per_class=8)
    first = manifest.scan(root, manifest_cache=store)
    sampled = set(manifest_identity.sample_positions(len(first)).tolist())
    victim = next(i for i in range(len(first)) if i not in sampled)
    _rewrite_same_size(first.path(victim), seed=77)
    # the restart check stats folders and the sample only: this edit is invisible to it (documented)
    assert manifest.scan(root, manifest_cache=store).fingerprint == first.fingerprint
    revised = manifest.scan(root, manifest_cache=store, rescan=True)
    assert revised.identity == first.identity and revised.revision != ""
    assert revised.fingerprint != first.fingerprint
    later = manifest.scan(root, manifest_cache=store)             # the revision is kept
    assert later.fingerprint == revised.fingerprint and later.source != "scan"
    assert counted() == {"walks": 2, "loads": 2}


def test_the_dataloader_never_serves_the_bytes_before_a_same_size_edit(tmp_path, store):
    root = _tree(str(tmp_path / "d"), seed=6)
    ds = coordl.ImageFolder(root, transform="val", size=32, manifest_cache=store)
    segments = []
    try:
        loader = coordl.DataLoader(ds, batch_size=5, shuffle=False, num_workers=0, cache="1MiB")
        segments.append(shm.segment_name(ds.fingerprint))
        for _ in range(2):
            for _ in loader:
                pass
        assert loader.stats()["cache_hits"] == len(ds)             # epoch 2 came from memory
        victim = 7
        _rewrite_same_size(ds.manifest.path(victim), seed=1234)
        new = coordl.ImageFolder(root, transform="val", size=32, manifest_cache=store)
        assert new.fingerprint != ds.fingerprint
        loader2 = coordl.DataLoader(new, batch_size=5, shuffle=False, num_workers=0, cache="1MiB")
        segments.append(shm.segment_name(new.fingerprint))
        images = [img for _ in range(2) for img, _ in loader2]
        with open(new.manifest.path(victim), "rb") as f:
            want, _ = new.prep(f.read(), victim, epoch=0)
        for epoch in range(2):
            got = images[epoch * 3 + victim // 5][victim % 5]
            assert np.array_equal(got.numpy(), want.numpy()), f"epoch {epoch} served other pixels"
        assert loader2.stats()["cache_hits"] == len(new)
    finally:
        for name in segments:
            shm.unlink(os.path.join(shm.SHM_DIR, name))


def test_a_directory_symlink_loop_lists_each_file_once(tmp_path, store):
    root = _tree(str(tmp_path / "d"), seed=7, classes=2, per_class=3)
    os.makedirs(os.path.join(root, "class_0", "sub"))
    with open(os.path.join(root, "class_0", "sub", "deep.jpg"), "wb") as f:
        f.write(_jpeg(5, 4096))
    os.symlink("..", os.path.join(root, "class_0", "sub", "loop"))       # class_0/sub/loop -> class_0
    os.symlink(os.path.join(root, "class_0", "sub"), os.path.join(root, "class_1", "linked"))
    m = manifest.scan(root, manifest_cache="off")
    rels = [m.relpath(i) for i in range(len(m))]
    # each folder once per class: class_1 reaches class_0/sub (as linked) and, through its loop,
    # class_0 itself (linked/loop), whose sub/ it has listed already
    assert rels == ["class_0/img_000.jpg", "class_0/img_001.jpg", "class_0/img_002.jpg", "class_0/sub/deep.jpg",
                    "class_1/img_000.jpg", "class_1/img_001.jpg", "class_1/img_002.jpg", "class_1/linked/deep.jpg",
                    "class_1/linked/loop/img_000.jpg", "class_1/linked/loop/img_001.jpg",
                    "class_1/linked/loop/img_002.jpg"]
    assert m.labels.tolist() == [0] * 4 + [1] * 7


# -- the persisted manifest ----------------------------------------------------------------

def test_an_unchanged_root_is_loaded_not_scanned(tmp_path, store, counted):
    root = _tree(str(tmp_path / "d"), seed=8)
    first = coordl.ImageFolder(root, manifest_cache=store).manifest
    again = [coordl.ImageFolder(root, manifest_cache=store).manifest for _ in range(3)]
    assert counted() == {"walks": 1, "loads": 3}
    assert first.source == "scan" and all(m.source.startswith(store) for m in again)
    assert all(_same(first, m) for m in again)
    assert again[0].relpath(4) == first.relpath(4) and again[0].total_bytes == first.total_bytes
    forced = coordl.ImageFolder(root, manifest_cache=store, rescan=True).manifest
    assert counted() == {"walks": 2, "loads": 3} and _same(first, forced)


def _add(root):
    with open(os.path.join(root, "class_2", "new.jpg"), "wb") as f:
        f.write(_jpeg(500, 4096))


def _remove(root):
    os.unlink(os.path.join(root, "class_0", "img_003.jpg"))


def _rename(root):
    os.rename(os.path.join(root, "class_1", "img_000.jpg"), os.path.join(root, "class_1", "img_zzz.jpg"))


def _rename_mtime_restored(root):
    d = os.path.join(root, "class_1")
    st = os.stat(d)
    _rename(root)
    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))   # the folder's ctime still moves


def _new_class(root):
    os.makedirs(os.path.join(root, "class_9"))
    _settle(root)
    with open(os.path.join(root, "class_9", "a.jpg"), "wb") as f:
        f.write(_jpeg(501, 4096))


def _resize_sampled(root):
    p = os.path.join(root, "class_0", "img_000.jpg")
    st = os.stat(p)
    with open(p, "ab") as f:
        f.write(b"\0" * 10)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def _touch_sampled(root):
    os.utime(os.path.join(root, "class_2", "img_004.jpg"), ns=(1, 1_700_000_000_000_000_000))


def _same_size_sampled(root):
    _rewrite_same_size(os.path.join(root, "class_2", "img_001.jpg"), seed=42)


def _replace_sampled(root):
    """Replaced by a same-size copy with the same mtime (new inode), via rename: folder changes too."""
    p = os.path.join(root, "class_0", "img_001.jpg")
    st = os.stat(p)
    with open(p + ".tmp", "wb") as f:
        f.write(_jpeg(43, st.st_size))
    os.utime(p + ".tmp", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(p + ".tmp", p)


@pytest.mark.parametrize("change", [_add, _remove, _rename, _rename_mtime_restored, _new_class, _resize_sampled,
                                    _touch_sampled, _same_size_sampled, _replace_sampled])
def test_every_detected_change_rescans_with_the_new_items_and_a_new_fingerprint(tmp_path, store, counted, change):
    root = _tree(str(tmp_path / "d"), seed=9)
    first = manifest.scan(root, manifest_cache=store)
    change(root)
    after = manifest.scan(root, manifest_cache=store)
    assert counted() == {"walks": 2, "loads": 0}
    truth = manifest.scan(root, manifest_cache="off")     # what a scan of the tree as it is now says
    assert _same(after, truth) or (after.identity == truth.identity and after.revision)
    assert after.fingerprint != first.fingerprint
    assert [after.relpath(i) for i in range(len(after))] == [truth.relpath(i) for i in range(len(truth))]


def test_a_fresh_tree_is_rescanned_until_its_folders_settle(tmp_path, store, counted):
    root = _tree(str(tmp_path / "d"), seed=10)
    _add(root)                                   # class_2's mtime is now: racy
    manifest.scan(root, manifest_cache=store)
    manifest.scan(root, manifest_cache=store)
    assert counted() == {"walks": 2, "loads": 0}
    _settle(root)
    manifest.scan(root, manifest_cache=store)
    manifest.scan(root, manifest_cache=store)
    assert counted() == {"walks": 3, "loads": 1}


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def _only_file(store: str) -> str:
    (path,) = [os.path.join(store, n) for n in os.listdir(store) if n.endswith(".manifest")]
    return path


def test_a_torn_or_damaged_manifest_file_is_rescanned_with_a_warning(tmp_path, store, counted):
    root = _tree(str(tmp_path / "d"), seed=11)
    first = manifest.scan(root, manifest_cache=store)
    path = _only_file(store)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 3)
    with pytest.warns(manifest_store.ManifestCacheWarning, match=f"{size - 3} bytes where its header records"):
        assert _same(manifest.scan(root, manifest_cache=store), first)
    header = manifest_store.read_header(path)               # one flipped byte in the sizes array
    _flip(path, header["body"] + header["arrays"]["sizes"][0] + 5)
    with pytest.warns(manifest_store.ManifestCacheWarning, match="damaged .an array fails its checksum"):
        assert _same(manifest.scan(root, manifest_cache=store), first)
    assert counted() == {"walks": 3, "loads": 0}


@pytest.mark.parametrize("target", [b'"class_1"', b'"fingerprint"', b'"dirs"'])
def test_a_flipped_byte_in_the_header_is_rescanned_with_a_warning_not_loaded(tmp_path, store, counted,
                                                                             target):
    root = _tree(str(tmp_path / "d"), seed=15)
    first = manifest.scan(root, manifest_cache=store)
    path = _only_file(store)
    with open(path, "rb") as f:
        at = f.read().index(target) + 2                     # "class_1" -> "clbss_1" (still valid JSON)
    _flip(path, at)
    with pytest.warns(manifest_store.ManifestCacheWarning, match="damaged .its header fails its checksum"):
        again = manifest.scan(root, manifest_cache=store)
    assert _same(again, first) and again.classes == ("class_0", "class_1", "class_2")
    assert counted() == {"walks": 2, "loads": 0}
    assert _same(manifest.scan(root, manifest_cache=store), first)   # rewritten: loaded again
    assert counted() == {"walks": 2, "loads": 1}


def test_a_manifest_of_another_format_is_rescanned_in_silence(tmp_path, store, counted, recwarn):
    root = _tree(str(tmp_path / "d"), seed=16)
    first = manifest.scan(root, manifest_cache=store)
    path = _only_file(store)
    with open(path, "r+b") as f:
        f.write(b"COORDLM2")                                # the format before the header checksum
    assert _same(manifest.scan(root, manifest_cache=store), first)
    assert counted() == {"walks": 2, "loads": 0}
    assert not [w for w in recwarn if issubclass(w.category, manifest_store.ManifestCacheWarning)]


def test_an_unwritable_manifest_folder_means_a_scan_and_a_warning(tmp_path, counted):
    root = _tree(str(tmp_path / "d"), seed=12)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    where = str(blocker / "manifests")
    for _ in range(2):
        with pytest.warns(manifest_store.ManifestCacheWarning,
                          match=f"cannot be used.*ImageFolder.manifest_cache='{where}'.: pass "
                                "manifest_cache=<a writable folder>, or manifest_cache='off'"):
            ds = coordl.ImageFolder(str(root), manifest_cache=where)
        assert len(ds) == 15
    assert counted() == {"walks": 2, "loads": 0}


def test_the_warning_names_the_variable_or_the_default_it_came_from(tmp_path, monkeypatch):
    root = _tree(str(tmp_path / "d"), seed=17)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(manifest_store.ENV, str(blocker / "env"))
    with pytest.warns(manifest_store.ManifestCacheWarning,
                      match=f"from COORDL_MANIFEST_CACHE='{blocker}/env': set COORDL_MANIFEST_CACHE to "
                            "a writable folder .or COORDL_MANIFEST_CACHE=off., or pass ImageFolder"):
        coordl.ImageFolder(root)
    monkeypatch.delenv(manifest_store.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.warns(manifest_store.ManifestCacheWarning,
                      match="the folder is the default .*: set COORDL_MANIFEST_CACHE=<a writable folder>"):
        coordl.ImageFolder(root)


def test_the_environment_variable_and_off(tmp_path, monkeypatch, counted):
    root = _tree(str(tmp_path / "d"), seed=13)
    monkeypatch.setenv(manifest_store.ENV, str(tmp_path / "env-store"))
    manifest.scan(root)
    manifest.scan(root)
    assert os.listdir(tmp_path / "env-store") and counted() == {"walks": 1, "loads": 1}
    monkeypatch.setenv(manifest_store.ENV, "off")
    manifest.scan(root)
    assert counted() == {"walks": 2, "loads": 1}
    monkeypatch.delenv(manifest_store.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert manifest_store.directory(None) == str(tmp_path / "xdg" / "coordl" / "manifests")


def test_a_custom_is_valid_file_is_never_persisted(tmp_path, store, counted):
    root = _tree(str(tmp_path / "d"), seed=14)
    for _ in range(2):
        m = manifest.scan(root, is_valid_file=lambda p: p.endswith("1.jpg"), manifest_cache=store)
    assert len(m) == 3 and counted() == {"walks": 2, "loads": 0} and not os.path.exists(store)


_STARTER = textwrap.dedent("""
    import hashlib, json, sys
    from coordl import manifest
    sys.stdin.readline()                      # the test lets all of them go at once
    m = manifest.scan(sys.argv[1], manifest_cache=sys.argv[2])
    print(json.dumps({"fp": m.fingerprint, "n": len(m), "labels": m.labels.tolist(),
                      "blob": hashlib.sha256(m.paths_blob.tobytes()).hexdigest(),
                      "off": m.path_offsets.tolist(), "sizes": m.sizes.tolist(), **manifest.SCANS}), flush=True)
""")


@pytest.mark.parametrize("settled", [True, False])
def test_four_processes_starting_at_once_get_the_same_valid_manifest(tmp_path, store, settled):
    root = _tree(str(tmp_path / "d"), seed=15, classes=6, per_class=30)
    if not settled:
        _add(root)
    procs = [subprocess.Popen([sys.executable, "-c", _STARTER, root, store], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        p.stdin.write("go\n")
    for p in procs:
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"starter {p.pid} failed"
        results.append(json.loads(out))
    truth = manifest.scan(root, manifest_cache="off")
    for r in results:
        assert r["fp"] == truth.fingerprint and r["n"] == len(truth)
        assert r["blob"] == __import__("hashlib").sha256(truth.paths_blob.tobytes()).hexdigest()
        assert r["off"] == truth.path_offsets.tolist() and r["sizes"] == truth.sizes.tolist()
        assert r["labels"] == truth.labels.tolist()
    if settled:  # one of them scanned under the lock, the three others loaded its file
        assert sorted((r["walks"], r["loads"]) for r in results) == [(0, 1), (0, 1), (0, 1), (1, 0)]
    assert not [n for n in os.listdir(store) if n.startswith(".tmp-")]
    shutil.rmtree(store)
