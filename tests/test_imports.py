"""The import graph of coordl/, cache/ and pipelines/: no cycle between modules nor between rooms,
and arrows one way.

Every import counts, also those inside functions (a deferred import is still a dependency). An
import of a package's submodule (`from coordl.manifest import store`) is an arrow to that module.
A room is a top-level package or module of coordl/ (`coordl.loader`, `coordl.epochs`,
`coordl.errors`, ...; pipelines/ is one room) and of cache/ (`coordl.cache.storage`,
`coordl.cache.minio`, `coordl.cache.partitioned`, `coordl.cache.shm`, ...): two rooms that import
each other, through any of their modules, are one room in two folders.
cache/ and pipelines/ may import nothing of coordl/ but the exception tree (coordl/errors.py).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"coordl": "coordl", "cache": "coordl.cache", "pipelines": "coordl.pipelines"}


def _modules(root: pathlib.Path = ROOT) -> dict[str, tuple[pathlib.Path, bool]]:
    """module name -> (file, is a package's __init__); C extensions by their source file (no imports)"""
    mods = {}
    for folder, prefix in FOLDERS.items():
        if not (root / folder).is_dir():
            continue
        for path in [*(root / folder).rglob("*.py"), *(root / folder).rglob("*.c")]:
            rel = path.relative_to(root / folder).with_suffix("").parts
            is_pkg = rel[-1] == "__init__"
            parts = rel[:-1] if is_pkg else rel
            mods[".".join((prefix, *parts))] = (path, is_pkg)
    return mods


def _source(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str, path: pathlib.Path, is_pkg: bool, known: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            pkg = _source(mod, is_pkg, node)
            targets = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in known else pkg for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != mod)
    return out


def graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of coordl/, cache/ and pipelines/ it imports (anywhere in the file)"""
    mods = _modules(root)
    known = set(mods)
    return {m: _imports(m, p, pkg, known) if p.suffix == ".py" else set() for m, (p, pkg) in mods.items()}


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def room(mod: str) -> str:
    """The room a module stands in: `coordl.X` (coordl/'s top-level packages and modules, pipelines/
    as one), or `coordl.cache.X` (cache/'s rooms and shared modules)."""
    parts = mod.split(".")
    return ".".join(parts[:3] if parts[:2] == ["coordl", "cache"] else parts[:2])


def room_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """room -> the other rooms its modules import"""
    out: dict[str, set[str]] = {room(m): set() for m in g}
    for m, deps in g.items():
        out[room(m)].update(room(d) for d in deps if room(d) != room(m))
    return out


def _crossings(g: dict[str, set[str]], rooms: list[str]) -> list[str]:
    """The module imports that run between the rooms of one cycle (for the failure message)."""
    return sorted(f"{m} -> {d}" for m, deps in g.items() for d in deps
                  if room(m) in rooms and room(d) in rooms and room(m) != room(d))


def test_the_graph_is_read():
    g = graph()
    assert "coordl.loader.dataloader" in g and "coordl.cache.minio.cache" in g
    assert "coordl.cache.shm" in g["coordl.cache.minio.cache"]  # a relative `from . import shm`
    assert "coordl.errors" in g["coordl.loader.dataloader"]
    assert "coordl.manifest._statnames" in g["coordl.manifest.walk"]  # inside a try, a C extension


def test_a_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_coordl_cache_and_pipelines():
    assert _cycles(graph()) == []


def test_no_import_cycle_between_rooms():
    g = graph()
    assert {room(m) for m in g} >= {"coordl.loader", "coordl.epochs", "coordl.datasets", "coordl.coordinator",
                                   "coordl.cache.storage", "coordl.cache.minio", "coordl.cache.partitioned",
                                   "coordl.cache.shm", "coordl.pipelines"}
    found = _cycles(room_graph(g))
    assert found == [], [_crossings(g, c) for c in found]


def test_a_cycle_between_rooms_is_found(tmp_path):
    """Two rooms whose modules import each other (no module cycle) are reported, on a small tree."""
    files = {
        "coordl/__init__.py": "",
        "coordl/errors.py": "",
        "coordl/loader/__init__.py": "",
        "coordl/loader/dataloader.py": "from coordl.datasets import base\n",
        "coordl/datasets/__init__.py": "",
        "coordl/datasets/base.py": "from coordl.loader import binding\n",
        "coordl/loader/binding.py": "from coordl import errors\n",
        "cache/__init__.py": "",
        "cache/shm.py": "",
        "cache/minio/__init__.py": "",
        "cache/minio/cache.py": "from .. import shm\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    g = graph(tmp_path)
    assert _cycles(g) == []  # no module imports itself back ...
    assert _cycles(room_graph(g)) == [["coordl.datasets", "coordl.loader"]]  # ... but two rooms do
    assert _crossings(g, ["coordl.datasets", "coordl.loader"]) == [
        "coordl.datasets.base -> coordl.loader.binding", "coordl.loader.dataloader -> coordl.datasets.base"]
    assert room_graph(g)["coordl.cache.minio"] == {"coordl.cache.shm"}  # cache/'s rooms are rooms


def test_no_private_name_is_imported_across_rooms():
    """A room's private names (`_NO_COUNTERS`, `_epoch_of`) stay in it: another room imports public ones."""
    mods, bad = _modules(), []
    for mod, (path, is_pkg) in mods.items():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                src = _source(mod, is_pkg, node)
                for a in node.names:
                    target = f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src
                    if (target in mods and room(target) != room(mod) and a.name.startswith("_")
                            and not a.name.startswith("__")):
                        bad.append(f"{mod}: from {src} import {a.name}")
    assert bad == []


def test_cache_and_pipelines_import_only_the_error_tree_of_coordl():
    bad = {}
    for mod, deps in graph().items():
        if mod.startswith(("coordl.cache", "coordl.pipelines")):
            wrong = {d for d in deps if d != "coordl"
                     and not d.startswith(("coordl.cache", "coordl.pipelines", "coordl.errors"))}
            if wrong:
                bad[mod] = sorted(wrong)
    assert bad == {}
