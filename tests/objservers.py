"""Real Google Cloud Storage and Azure Blob emulators for tests: one subprocess each on a free
loopback port, started and stopped by the test that needs it (as tests/s3server.py does for moto).

    server = GcsEmulator().start()      # gcp-storage-emulator (PyPI, the JSON API), in memory
    server = Azurite().start()          # Azurite's blob service (npm; install.sh puts it in .venv/azurite)
    server.options()                    # storage_options for coordl / gcsfs / adlfs against it
    server.filesystem()                 # a gcsfs / adlfs filesystem on it, to create buckets and upload
    upload_folder(server, "bucket", local_root, "train")
    server.kill()                       # SIGKILL (a store that goes away at once), reaped
    server.stop()                       # SIGTERM (SIGKILL after 10 s), reaped

`azurite_command()` is None (with `AZURITE_MISSING` the reason) when Azurite is not installed.
Not a library module: coordl never imports it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

_spec = importlib.util.spec_from_file_location(
    "coordl_tests_s3server", os.path.join(os.path.dirname(os.path.abspath(__file__)), "s3server.py"))
_s3server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s3server)
free_port = _s3server.free_port  # not sys.path: tests/ holds a coordl/ folder that would shadow the package

#: Azurite's well-known development account (public: documented by Microsoft for the emulator).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
#: Where install.sh puts Azurite: <venv>/azurite/node_modules/.bin/azurite-blob.
AZURITE_BIN = os.path.join(sys.prefix, "azurite", "node_modules", ".bin", "azurite-blob")
AZURITE_MISSING = (f"Azurite is not installed ({AZURITE_BIN} and azurite-blob on PATH absent): run install.sh "
                   "with npm on PATH, or npm install --prefix .venv/azurite azurite")


def azurite_command() -> str | None:
    """The azurite-blob executable: install.sh's, else one on PATH, else None."""
    return AZURITE_BIN if os.access(AZURITE_BIN, os.X_OK) else shutil.which("azurite-blob")


class _Child:
    """A server subprocess on 127.0.0.1:<free port>, ready once `ready_path` answers any HTTP status."""

    ready_path = "/"

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._workdir = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, port: int, workdir: str) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 60.0):
        self._workdir = self._workdir or tempfile.mkdtemp(prefix=f"coordl-test-{type(self).__name__.lower()}-")
        for _ in range(5):
            self.port = free_port()
            with open(os.path.join(self._workdir, "stderr.log"), "wb") as log:
                self.proc = subprocess.Popen(self.command(self.port, self._workdir), cwd=self._workdir,
                                             stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(self.url + self.ready_path, timeout=2):
                        return self
                except urllib.error.HTTPError:
                    return self  # it answers
                except OSError:
                    time.sleep(0.1)
            self._end()  # the port was taken meanwhile, or it did not come up: another port
        with open(os.path.join(self._workdir, "stderr.log"), "rb") as log:
            said = log.read()[-2000:].decode(errors="replace")
        self.stop()
        raise RuntimeError(f"could not start {type(self).__name__} on a free loopback port; it said: {said}")

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after 10 s); its working folder removed."""
        self._end()
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = ""

    def kill(self) -> None:
        """SIGKILL, as a store that goes away at once; reaped (stop() still removes its folder)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def _end(self) -> None:
        _s3server.stop_child(self.proc)


class GcsEmulator(_Child):
    """`gcp-storage-emulator start` (the GCS JSON API), state in memory."""

    ready_path = "/storage/v1/b"

    def command(self, port: int, workdir: str) -> list[str]:
        return [sys.executable, "-m", "gcp_storage_emulator",
                "start", "-H", "127.0.0.1", "--port", str(port), "--in-memory", "-q"]

    def options(self, endpoint_url: str | None = None) -> dict:
        """storage_options for gs:// URLs on this emulator (anonymous: it checks no credentials)."""
        return {"endpoint_url": endpoint_url or self.url, "token": "anon", "project": "coordl-test"}

    def filesystem(self):
        from gcsfs.core import GCSFileSystem
        return GCSFileSystem(skip_instance_cache=True, **self.options())


class Azurite(_Child):
    """Azurite's blob service (`azurite-blob`), state in memory, account devstoreaccount1."""

    ready_path = f"/{AZURE_ACCOUNT}?comp=list"

    def command(self, port: int, workdir: str) -> list[str]:
        exe = azurite_command()
        if exe is None:
            raise RuntimeError(AZURITE_MISSING)
        return [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--silent",
                "--disableTelemetry", "--skipApiVersionCheck"]  # in memory: no --location (refused with it)

    def connection_string(self, endpoint_url: str | None = None) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
                f"BlobEndpoint={endpoint_url or self.url}/{AZURE_ACCOUNT};")

    def options(self, endpoint_url: str | None = None) -> dict:
        """storage_options for az:// URLs on this emulator (adlfs: the account's connection string)."""
        return {"connection_string": self.connection_string(endpoint_url)}

    def filesystem(self):
        from adlfs import AzureBlobFileSystem
        return AzureBlobFileSystem(skip_instance_cache=True, **self.options())


def upload_folder(server: GcsEmulator | Azurite, bucket: str, root: str, prefix: str = "") -> list[str]:
    """Create `bucket` (a GCS bucket, an Azure container; if needed) and put every file under `root` at
    prefix/<relative path>; returns the keys written (relative to prefix), sorted."""
    fs = server.filesystem()
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            with open(os.path.join(dirpath, name), "rb") as f:
                files["/".join(p for p in (bucket, prefix.strip("/"), rel) if p)] = f.read()
    fs.pipe(files)
    return sorted(os.path.relpath(k, "/".join(p for p in (bucket, prefix.strip("/")) if p)) for k in files)
