"""Helpers for the object-store tests (imported by conftest.py and the tests): the server and proxy
modules, the uploaded dataset, and a local walk to compare listings with."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(os.path.dirname(TESTS), "bench")


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


s3server = _load("coordl_tests_s3server", os.path.join(TESTS, "s3server.py"))
objstore_proxy = _load("coordl_bench_objstore_proxy", os.path.join(BENCH, "lib", "objstore_proxy.py"))

BUCKET, PREFIX = "data", "train"


@dataclasses.dataclass
class S3Dataset:
    server: object        # s3server.MotoServer
    root: str             # the same files on local disk
    url: str              # s3://data/train
    keys: list            # keys relative to url, as uploaded

    def options(self, **changes) -> dict:
        return {**self.server.options(), **changes}

    def local_bytes(self, key: str) -> bytes:
        with open(os.path.join(self.root, key), "rb") as f:
            return f.read()


def make_s3_dataset(server, tiny_root: str, tmp_path_factory) -> S3Dataset:
    """tiny_root's 40 JPEGs in 4 classes, plus a nested folder (class_0001/a_sub/) whose files a
    local walk lists after the class's own files although their keys sort before them as strings."""
    root = str(tmp_path_factory.mktemp("s3-local") / "train")
    shutil.copytree(tiny_root, root)
    os.makedirs(os.path.join(root, "class_0001", "a_sub"))
    source = os.path.join(root, "class_0000", "img_0000000.jpg")
    for name in ("img_b.jpg", "img_a.jpg"):
        shutil.copy(source, os.path.join(root, "class_0001", "a_sub", name))
    keys = s3server.upload_folder(server, BUCKET, root, PREFIX)
    return S3Dataset(server, root, f"s3://{BUCKET}/{PREFIX}", keys)


def local_walk(root: str) -> list[tuple[str, int]]:
    """(relative path, size) of every file under root's class folders, in a local walk's order
    (each folder's files by name, then its sub-folders by name), as coordl's scan lists them."""
    out = []
    for cls in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for dirpath, dirnames, files in os.walk(os.path.join(root, cls)):
            dirnames.sort()
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                out.append((os.path.relpath(path, root).replace(os.sep, "/"), os.path.getsize(path)))
    return out
