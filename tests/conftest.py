"""Shared fixtures: small real JPEG datasets and leak checks.

Every coordl segment of this session lives in a folder of its own on the tmpfs,
``/dev/shm/pytest-shm-<pid>-<random>``: COORDL_SHM_DIR is set to it below, before anything
imports coordl (coordl.cache.shm reads it at import), so every default, subprocess and
coordinator daemon of the session uses it, whatever COORDL_SHM_DIR was. `no_leaks` (autouse)
fails a test that leaves a new entry in that folder or a child process running;
`shm_session_dir` removes the folder at the end and fails if anything was left in it. Two
sessions at once (two people, a suite loop beside a helper's tests) never see each other's
segments. The folder's name holds no 'coordl': coordl's own tools (`coordl cache ls`,
`coordl cleanup`) run on the real /dev/shm never take it for a segment. Datasets are real
JPEG folders made by coordl.cli.make_dataset, small enough to decode quickly.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile

#: This session's shared-memory folder (mode 0755: other uids reach folders inside it, test_shared_node).
SHM_DIR = tempfile.mkdtemp(prefix=f"pytest-shm-{os.getpid()}-", dir="/dev/shm")
os.chmod(SHM_DIR, 0o755)
os.environ["COORDL_SHM_DIR"] = SHM_DIR
# pytest_unconfigure and shm_session_dir remove it; this, where neither runs (an import below
# failed, so pytest never loaded this file): by this process only, not by a forked child of it
atexit.register(lambda pid=os.getpid(): os.getpid() == pid and shutil.rmtree(SHM_DIR, ignore_errors=True))

import time  # noqa: E402 (COORDL_SHM_DIR first)

import psutil  # noqa: E402
import pytest  # noqa: E402

from coordl.cache import shm  # noqa: E402
from coordl.cli.make_dataset import make_dataset  # noqa: E402

# tests/forked.py, tests/jobs.py and tests/loaderhelp.py, importable as `coordl_tests_forked`,
# `coordl_tests_jobs` and `coordl_tests_loaderhelp` (tests/ is no package, and importlib mode puts
# nothing on sys.path): commands and scripts as forked children of the test process; training jobs
# run as a user runs them, bounded; an epoch's batches and counters
for _name, _file in (("coordl_tests_forked", "forked.py"), ("coordl_tests_jobs", "jobs.py"),
                     ("coordl_tests_loaderhelp", "loaderhelp.py")):
    _spec = importlib.util.spec_from_file_location(_name, os.path.join(os.path.dirname(__file__), _file))
    sys.modules[_name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_name])


def _session_shm() -> set[str]:
    return set(os.listdir(SHM_DIR))


# Python's own per-interpreter helpers (started once by spawn/forkserver, live until exit)
_STDLIB_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _children() -> list[psutil.Process]:
    kids = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE or any(h in " ".join(p.cmdline()) for h in _STDLIB_HELPERS):
                continue
        except psutil.NoSuchProcess:
            continue
        kids.append(p)
    return kids


@pytest.fixture(scope="session", autouse=True)
def shm_session_dir():
    """This session's shared-memory folder (COORDL_SHM_DIR); removed at the end, when it must be
    empty: what is left there is a leak, and fails the session (after it is removed)."""
    if shm.SHM_DIR != SHM_DIR:  # coordl was imported before this conftest set COORDL_SHM_DIR
        pytest.fail(f"coordl.cache.shm.SHM_DIR is {shm.SHM_DIR!r}, not this session's {SHM_DIR!r}: "
                    "something imported coordl before tests/conftest.py ran")
    yield SHM_DIR
    left = sorted(os.listdir(SHM_DIR))
    shutil.rmtree(SHM_DIR, ignore_errors=True)
    if left:
        pytest.fail(f"left in {SHM_DIR} at the end of the session (leaked; removed now): {left}")


# -- tiers: `pytest -n 2 -m "not slow"` is the fast tier a developer runs before every commit -------
# Assigned here, by folder, file and fixture, never test by test: a new test lands in the right tier
# by where it lives and what it starts. `slow` = starts a `coordl serve` daemon (the `serve`,
# `shared_serve` and `sockdir` fixtures), runs a training framework (integrations/), a benchmark (bench/), a whole
# profile run, or the demo; kills or stalls an object store and waits out its timeouts, or runs whole
# loaders over one (objstore/ fault and end-to-end files; test_cli_s3.py serves and profiles an s3:// URL;
# test_obstore_client.py forks DataLoader workers and kills servers mid-request, ~30 s of the fast tier);
# sweeps every corruption of a JPEG corpus.
SLOW_FOLDERS = ("integrations", "bench")
SLOW_FILES = ("coordl/profiler/test_profile.py", "coordl/profiler/test_cli_profile.py", "coordl/test_demo.py",
              "objstore/test_objstore_faults.py", "objstore/test_imagefolder_s3.py", "objstore/test_cli_s3.py",
              "objstore/test_webdataset_s3.py", "objstore/test_partitioned_s3.py", "objstore/test_storage_counts.py",
              "objstore/test_integrations_s3.py", "objstore/test_bench_objstore.py", "objstore/test_read_ahead.py",
              "coordl/profiler/test_profile_datasets.py", "objstore/test_static_listing.py",
              "objstore/test_gcs_azure.py", "pipelines/test_corrupt.py", "objstore/test_webdataset_read_ahead.py",
              "objstore/test_gcs_azure_faults.py", "objstore/test_obstore_client.py",
              "objstore/test_snapshot_s3.py")
SLOW_FIXTURES = {"serve", "sockdir", "shared_serve"}
_TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = os.path.relpath(str(item.path), _TESTS)
        if (rel.split(os.sep)[0] in SLOW_FOLDERS or rel in SLOW_FILES
                or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config):
    """A session that ran no test (--collect-only, a collection error) still removes its folder."""
    shutil.rmtree(SHM_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leaks():
    """Every test leaves this session's shared-memory folder and the process tree as it found them."""
    shm_before = _session_shm()
    kids_before = {p.pid for p in _children()}
    yield
    deadline = time.monotonic() + 10.0
    while True:
        new_shm = _session_shm() - shm_before
        new_kids = [p for p in _children() if p.pid not in kids_before]
        if not new_shm and not new_kids:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    msg = []
    if new_shm:
        msg.append(f"left in {SHM_DIR}: {sorted(new_shm)}")
    if new_kids:
        msg.append("child processes still running: " + ", ".join(
            f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in new_kids))
    pytest.fail("; ".join(msg))


@pytest.fixture(scope="session", autouse=True)
def manifest_cache(tmp_path_factory):
    """Saved manifests go to a folder of this session (and to its subprocesses), not ~/.cache."""
    path = str(tmp_path_factory.mktemp("manifests"))
    old = os.environ.get("COORDL_MANIFEST_CACHE")
    os.environ["COORDL_MANIFEST_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("COORDL_MANIFEST_CACHE", None)
    else:
        os.environ["COORDL_MANIFEST_CACHE"] = old


def _in_child(check) -> int:
    """Run `check()` -> bool in a forked child; its exit code (0: True, 2: False, 1: it raised)."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            code = 0 if check() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def in_child():
    """`in_child(check)`: run `check()` -> bool in a forked child of this process; its exit code
    (0: True, 2: False, 1: it raised)."""
    return _in_child


@pytest.fixture
def dropped():
    """Datasets appended here have their MinIO cache segment unlinked after the test, whatever
    happens (a user dataset, or a loader's bound copy, loader.dataset, that holds the cache)."""
    datasets: list = []
    yield datasets
    for ds in datasets:
        name = shm.segment_name(ds.fingerprint)
        if ds.cache is not None:
            ds.cache.drop()
        shm.unlink(os.path.join(shm.SHM_DIR, name))


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> str:
    """40 JPEGs, 4 classes, 160x120: fast to decode."""
    root = str(tmp_path_factory.mktemp("tiny"))
    make_dataset(root, images=40, classes=4, size=(160, 120), quality=85, seed=1, workers=1, progress=False)
    return root


@pytest.fixture(scope="session")
def photo_root(tmp_path_factory) -> str:
    """24 JPEGs at 500x375, quality 90 (photo-like sizes), some 1500x1125."""
    root = str(tmp_path_factory.mktemp("photo"))
    make_dataset(root, images=24, classes=3, seed=2, large_fraction=0.25, workers=1, progress=False)
    return root


# -- real redis-server processes for the partitioned cache (coordl.cache.partitioned.redisnode) --

class RedisNode:
    """One redis-server child on a free loopback port, configured as `coordl cache-node start` does."""

    def __init__(self, directory: str, memory: int, password: str | None) -> None:
        self.directory, self.memory, self.password = directory, memory, password
        self.proc = None
        self.port = 0

    @property
    def url(self) -> str:
        return self.cfg.url

    @property
    def cfg(self):
        from coordl.cache.partitioned.redisnode import NodeConfig
        return NodeConfig(port=self.port, memory=self.memory, password=self.password)

    def start(self, port: int | None = None) -> RedisNode:
        """Start (again, on the same port when it had one); wait until it answers PING."""
        import socket

        from coordl.cache.partitioned import redisnode
        from coordl.errors import CacheError
        for _ in range(5):
            if port or self.port:
                self.port = port or self.port
            else:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    self.port = s.getsockname()[1]
            self.proc = redisnode.launch(self.cfg, self.directory)
            try:
                redisnode.wait_ready(self.url, self.proc)
                return self
            except CacheError:
                self.stop()
                if port:
                    raise
                self.port = 0  # the free port was taken meanwhile: pick another
        raise RuntimeError("could not start redis-server on a free port")

    def stop(self) -> None:
        """SIGTERM and wait: the server holds nothing on disk (no RDB/AOF)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def client(self):
        import redis
        return redis.Redis.from_url(self.url)


@pytest.fixture
def redis_nodes(tmp_path):
    """start(memory=64MiB, password=None) -> a running RedisNode; every node is stopped at the end
    of the test, and checked to be gone (its process reaped, its port closed)."""
    import socket

    nodes: list[RedisNode] = []

    def start(memory: int = 64 * 2**20, password: str | None = None) -> RedisNode:
        node = RedisNode(str(tmp_path / f"redis{len(nodes)}"), memory, password)
        nodes.append(node)
        return node.start()

    yield start
    for node in nodes:
        node.stop()
    for node in nodes:
        assert node.proc.returncode is not None, f"redis-server on port {node.port} still running"
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", node.port)) != 0, f"port {node.port} still answers"
