"""The guides in docs/ run as written: every fenced ```python and ```bash block of a page, in order.

Each page runs in a fresh interpreter (`python -c DRIVER`) in a fresh temporary folder: its python
blocks run one after the other in one namespace (as a reader pastes them into one session), its
bash blocks with `bash -euo pipefail` and the venv's bin/ first on PATH (as after `. .venv/bin/activate`).
Pages make their own small dataset with `coordl make-dataset`.

Just before a block (the line above its fence), a page may say why the test does not run it:

    <!-- docs-test: skip (needs a GPU) -->
    <!-- docs-test: tested-by tests/path/test_x.py::test_name -->

A `tested-by` test must exist (checked here). Servers: a page in SERVERS gets its own, started by this
test on free loopback ports (moto for s3://, gcp-storage-emulator for gs://); the page's literal
ports (5000, 9023, 6390-6399) are replaced by free ports before it runs, so a page that starts a
cache node (`coordl cache-node start --port 6390`) starts it on a free port, and the test stops it
afterwards whatever happened. TMPDIR is a folder of the test's own (a cache node's pid and log files
go there). The Redis on 6379 is never used. Each page gets a shared-memory folder
of its own (COORDL_SHM_DIR), emptied with `coordl cache drop --all` and removed afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
BIN = os.path.dirname(sys.executable)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(skip|tested-by)\s*(.*?)\s*-->\s*$")
RUN = ("python", "bash")
#: a server's port as pages write it: after a colon (a URL), `--port ` or `-p `
PORT = re.compile(r"(?:(?<=:)|(?<=--port )|(?<=-p ))(5000|9023|639\d)(?!\d)")

#: pages that need servers the test starts (and so run in the slow tier), and pages whose run is
#: costly (a daemon, a framework, a profile): the fast tier keeps to a few seconds a page.
SERVERS = {"object-storage.md": ("moto", "gcs")}
SLOW = {"object-storage.md", "partitioned-cache.md", "coordinator.md", "profiler.md", "integrations.md", "gpu-prep.md",
        "resume.md", "webdataset.md"}
#: seconds a page may run (a hang fails the test instead of the suite)
TIMEOUT = 300


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "tests", file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pages() -> list[str]:
    return sorted(n for n in os.listdir(DOCS) if n.endswith(".md"))


def blocks(text: str) -> list[dict]:
    """The fenced blocks of a page: language, code, line of the fence, and the directive above it."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        above = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        d = DIRECTIVE.search(above)
        out.append({"lang": m.group(1), "code": m.group(2), "line": line,
                    "directive": (d.group(1), d.group(2)) if d else None})
    return out


def _driver(page: str, runnable: list[dict]) -> str:
    """The script of one page: python blocks exec'd in one namespace, bash blocks in bash."""
    parts = ["import subprocess, sys, time", "ns = {'__name__': '__main__'}", "t0 = time.monotonic()"]
    for b in runnable:
        where = f"{page if page == 'README.md' else 'docs/' + page}:{b['line']}"
        if b["lang"] == "python":
            parts.append(f"print({('--- ' + where)!r}, f'{{time.monotonic() - t0:.1f}} s', flush=True)")
            parts.append(f"exec(compile({b['code']!r}, {where!r}, 'exec'), ns)")
        else:
            parts.append(f"print({('--- ' + where)!r}, f'{{time.monotonic() - t0:.1f}} s', flush=True)")
            parts.append(f"r = subprocess.run(['bash', '-euo', 'pipefail', '-c', {b['code']!r}])")
            parts.append(f"sys.exit(f'{where}: bash block exited {{r.returncode}}') if r.returncode else None")
    parts.append("print('--- end', f'{time.monotonic() - t0:.1f} s', flush=True)")
    return "\n".join(parts) + "\n"


def _ports(text: str) -> dict[str, int]:
    """Literal ports of the page's servers -> free ports for this run."""
    s3server = _load("docs_s3server", "s3server.py")
    found = set(PORT.findall(text))
    return {p: s3server.free_port() for p in sorted(found)}


def _substitute(text: str, ports: dict[str, int]) -> str:
    return PORT.sub(lambda m: str(ports[m.group(1)]), text)


def _start_servers(page: str, ports: dict[str, int]) -> list:
    """The servers a page talks to, on the free ports its literal ones were mapped to."""
    started = []
    for kind in SERVERS.get(page, ()):
        if kind == "moto":
            s3server = _load("docs_s3server", "s3server.py")
            server = s3server.MotoServer()
            port = ports["5000"]
            server.port = port
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
            server.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            started.append(server)
            _wait_http(f"http://127.0.0.1:{port}/moto-api/data.json", server.proc)
        elif kind == "gcs":
            port = ports["9023"]
            proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "-H", "127.0.0.1",
                                     "--port", str(port), "--in-memory", "-q"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started.append(proc)
            _wait_http(f"http://127.0.0.1:{port}/storage/v1/b", proc)
    return started


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server for {url} did not come up (exit {proc.poll()})")


def _stop(server) -> None:
    proc = getattr(server, "proc", server)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _stop_daemon(sock: str, env: dict) -> None:
    """SIGTERM the coordinator daemon listening on `sock` (its pid from `coordl status --json`), and
    wait until it is gone."""
    import json
    import signal
    import time

    out = subprocess.run([os.path.join(BIN, "coordl"), "status", "--socket", sock, "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return  # nothing listens there any more
    pid = json.loads(out.stdout)["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def _params():
    out = []
    for page in pages():
        marks = [pytest.mark.slow] if page in SLOW or page in SERVERS else []
        out.append(pytest.param(page, marks=marks, id=page))
    return out


@pytest.mark.parametrize("page", _params())
def test_page_runs_as_written(page, tmp_path):
    with open(os.path.join(DOCS, page)) as f:
        text = f.read()
    _run_page(page, text, tmp_path)


def test_the_readme_first_example_runs_as_written(tmp_path):
    """The README's "A first example" blocks, from a folder where `.venv` is this venv (as in a clone)."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    section = text[text.index("## A first example"):]
    section = section[:section.index("\n## ", 1)]
    os.symlink(sys.prefix, tmp_path / ".venv")
    _run_page("README.md", section, tmp_path)


def test_the_readme_keeps_its_two_commands_and_five_minutes():
    """Lines 3-6 are the two commands (.ci/run runs the second), and the README stays short."""
    with open(os.path.join(REPO, "README.md")) as f:
        lines = f.read().splitlines()
    assert lines[2:6] == [
        "```bash",
        "bash install.sh && .venv/bin/coordl demo      # install, make a small JPEG dataset, load it with coordl "
        "and with torch, compare",
        "bash install.sh && .venv/bin/pytest -n 2      # install and run the whole test suite on 2 cores (CI runs "
        "this, with .ci/typecheck between)",
        "```"]
    assert len(lines) <= 300
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = f.read()
    assert "bash install.sh && .ci/typecheck && .venv/bin/pytest -n 2" in ci


def _run_page(page: str, text: str, tmp_path) -> None:
    runnable = [b for b in blocks(text) if b["lang"] in RUN and b["directive"] is None]
    installs = [b["line"] for b in runnable if re.search(r"^\s*(\S*python3? -m )?pip3? install", b["code"], re.M)]
    assert not installs, f"docs/{page}: blocks at lines {installs} install packages: mark them docs-test: skip"
    if not runnable:
        pytest.skip(f"docs/{page} has no block to run")
    ports = _ports(text)
    runnable = [{**b, "code": _substitute(b["code"], ports)} for b in runnable]
    shm_dir = os.path.join(os.environ["COORDL_SHM_DIR"], f"docs-{os.getpid()}")
    os.makedirs(shm_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_", "PYTEST_"))}
    # TMPDIR: a short folder of the test's own, removed after. Short: Python's multiprocessing puts
    # the socket torch's workers pass shared-memory fds through in TMPDIR, and a unix socket's path
    # has at most 107 bytes; under xdist's tmp_path (pytest-1NN/popen-gwN/...) it did not fit and
    # the page's DataLoader hung waiting for its first batch.
    tmpdir = tempfile.mkdtemp(prefix="docs-", dir="/tmp")
    env.update(PATH=BIN + os.pathsep + os.environ["PATH"], COORDL_SHM_DIR=shm_dir, PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg", TMPDIR=tmpdir)
    servers = _start_servers(page, ports)
    try:
        proc = subprocess.run([sys.executable, "-c", _driver(page, runnable)], cwd=tmp_path, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, f"docs/{page} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        if os.environ.get("DOCS_TEST_VERBOSE"):
            print(proc.stdout)
    finally:
        for old, p in ports.items():  # a cache node the page started and did not stop (a failed block)
            if old.startswith("639"):
                subprocess.run([os.path.join(BIN, "coordl"), "cache-node", "stop", "--port", str(p)],
                               env=env, capture_output=True, timeout=60)
        for s in servers:
            _stop(s)
        for sock in tmp_path.glob("*.sock"):  # a `coordl serve --detach` the page started and a failure left
            _stop_daemon(str(sock), env)
        subprocess.run([os.path.join(BIN, "coordl"), "cache", "drop", "--all"], env=env, capture_output=True,
                       timeout=60)
        shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_tested_by_names_an_existing_test():
    """`<!-- docs-test: tested-by tests/x.py::name -->` names a test function that exists."""
    seen = 0
    for page in pages():
        with open(os.path.join(DOCS, page)) as f:
            for b in blocks(f.read()):
                if not b["directive"]:
                    continue
                kind, arg = b["directive"]
                where = f"docs/{page}:{b['line']}"
                if kind == "skip":
                    assert re.fullmatch(r"\(.+\)", arg), f"{where}: skip needs a reason in parentheses"
                    continue
                seen += 1
                path, _, name = arg.partition("::")
                assert name and os.path.isfile(os.path.join(REPO, path)), f"{where}: no test file {path}"
                with open(os.path.join(REPO, path)) as t:
                    assert re.search(rf"^\s*(async )?def {re.escape(name)}\(", t.read(), re.M), \
                        f"{where}: {path} has no test {name}"
    assert seen > 0


def test_every_page_is_linked_from_the_readme():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    missing = [p for p in pages() if f"docs/{p}" not in readme]
    assert not missing, f"README.md links no docs/ page {missing}"


def _anchors(text: str) -> set[str]:
    """The anchors GitHub makes of a page's headings (lower case, punctuation dropped, spaces -> -)."""
    text = FENCE.sub("", text)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_links_between_pages_resolve():
    """Relative links of README.md and docs/*.md name files that exist, and #anchors headings there."""
    for name in ["README.md"] + [f"docs/{p}" for p in pages()]:
        with open(os.path.join(REPO, name)) as f:
            text = f.read()
        base = os.path.dirname(os.path.join(REPO, name))
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)]*))?\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = os.path.join(base, target) if target else os.path.join(REPO, name)
            assert os.path.exists(path), f"{name}: link to {target} (no such file)"
            if anchor and path.endswith(".md"):
                with open(path) as f:
                    assert anchor in _anchors(f.read()), f"{name}: link to {target}#{anchor} (no such heading)"


def test_results_page_cites_every_file_in_bench_results():
    """docs/results.md names every file of bench/results/ (an uncited result is removed, not kept),
    and every bench/results/ path it names exists."""
    with open(os.path.join(DOCS, "results.md")) as f:
        text = f.read()
    folder = os.path.join(REPO, "bench", "results")
    uncited = [n for n in sorted(os.listdir(folder))
               if f"bench/results/{n}" not in text and f"`{n}`" not in text]
    assert not uncited, f"docs/results.md does not cite {uncited}"
    missing = [p for p in set(re.findall(r"bench/results/[\w.-]+\.\w+", text))
               if not os.path.exists(os.path.join(REPO, p))]
    assert not missing, f"docs/results.md cites {missing}, which do not exist"


def test_no_extra_that_fails_from_a_clone():
    """`pip install coordl[x]` does not work from a clone (and unquoted fails in zsh): docs say
    `pip install -e '.[x]'`."""
    for name in ["README.md"] + [f"docs/{p}" for p in pages()]:
        with open(os.path.join(REPO, name)) as f:
            text = f.read()
        bad = re.findall(r"pip install '?coordl\[[^\]]*\]'?", text)
        assert not bad, f"{name}: {bad} (write pip install -e '.[extra]')"


def test_block_parser():
    text = textwrap.dedent("""\
        intro
        <!-- docs-test: skip (needs a GPU) -->
        ```python
        import torch
        ```

        ```bash
        echo hi
        ```
        ```text
        output
        ```
        """)
    got = blocks(text)
    assert [(b["lang"], b["line"], b["directive"]) for b in got] == [
        ("python", 3, ("skip", "(needs a GPU)")), ("bash", 7, None), ("text", 10, None)]
    assert got[1]["code"] == "echo hi\n"


def _layout_paths() -> list[str]:
    with open(os.path.join(DOCS, "layout.md")) as f:
        return re.findall(r"^- `([^`]+)` — ", f.read(), re.M)


def test_layout_names_only_paths_that_exist():
    paths = _layout_paths()
    assert len(paths) > 10
    missing = [p for p in paths if not os.path.exists(os.path.join(REPO, p))]
    assert not missing, f"docs/layout.md names {missing}, which do not exist: update the page"
    assert all(os.path.isdir(os.path.join(REPO, p)) == p.endswith("/") for p in paths), "folders end with /"


def test_layout_names_every_package_folder():
    """Every package folder (a folder with an __init__.py) of coordl/, cache/ and pipelines/ has its line."""
    named = set(_layout_paths())
    packages = []
    for top in ("coordl", "cache", "pipelines"):
        for folder, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                packages.append(os.path.relpath(folder, REPO) + "/")
    assert len(packages) >= 3
    unnamed = sorted(set(packages) - named)
    assert not unnamed, f"docs/layout.md has no line for {unnamed}: add one (`path/` — what it holds)"
