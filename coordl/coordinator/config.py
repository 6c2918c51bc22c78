"""The daemon's settings, validated in one place, and where its socket lives."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from coordl import names
from coordl.errors import ConfigError, CoordinatorError, CoordlError

_SUN_PATH_MAX = 107  # bytes of a Unix socket path (sockaddr_un.sun_path, less the NUL)
BACKENDS, DALI_DEVICES = names.BACKENDS, names.DALI_DEVICES  # (coordl/names.py; backends: workers.py)


def default_socket_path() -> str:
    """$XDG_RUNTIME_DIR/coordl/serve.sock, else /tmp/coordl-<uid>/serve.sock."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    sub = "coordl" if base != "/tmp" else f"coordl-{os.getuid()}"
    return os.path.join(base, sub, "serve.sock")


def parse_address(address: str | os.PathLike) -> str:
    """'unix:///run/x.sock' or '/run/x.sock' -> '/run/x.sock'."""
    text = os.fspath(address)
    if text.startswith("unix://"):
        text = text[len("unix://"):]
    elif "://" in text:
        raise ConfigError(f"coordinator={address!r}: only unix:// addresses are supported, "
                          "e.g. coordinator='unix:///tmp/coordl-1000/serve.sock'")
    if not text:
        raise ConfigError(f"coordinator={address!r} names no socket path")
    return os.path.abspath(os.path.expanduser(text))


def check_socket_path(path: str) -> None:
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        raise ConfigError(f"socket path {path!r} is longer than the {_SUN_PATH_MAX} bytes a Unix "
                          "socket allows: pass a shorter --socket")


def socket_folder(prefix: str, name: str = "serve.sock") -> str:
    """A new private folder (mkdtemp, mode 0700) for a socket `name`, in the temp dir ($TMPDIR), or
    in /tmp where the temp dir's path is so long that the socket's would not fit sun_path."""
    folder = tempfile.mkdtemp(prefix=prefix)
    if len(os.fsencode(os.path.join(folder, name))) > _SUN_PATH_MAX and folder != "/tmp":
        os.rmdir(folder)
        folder = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    return folder


def private_dir(path: str) -> None:
    """Create the socket's folder (mode 0700) if missing; refuse one where others may replace files."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.stat(folder)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise CoordinatorError(f"socket folder {folder!r} is writable by every user (mode "
                               f"{stat.S_IMODE(st.st_mode):o}, no sticky bit), so anyone could replace "
                               "the socket: pass --socket in a folder of your own")


def _default_workers() -> int:
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class ServeConfig:
    data: str                               # ImageFolder root ("" with `dataset`)
    batch_size: int                         # B
    transform: str = "train"                # "train" or "val"
    size: int | None = None                 # --data: output height and width (None: 224); --dataset:
                                            # None serves its samples by sample_spec() (spec.py), N
                                            # declares uint8 images (3, N, N) or (N, N, 3)
    epochs: int | None = None               # epochs each job gets (None: serve until stopped)
    seed: int = 0                           # order and augmentation seed
    workers: int = field(default_factory=_default_workers)  # W prep processes
    cache_bytes: int | None = None          # MinIO cache budget (None: no cache)
    socket: str = field(default_factory=default_socket_path)
    slots: int = 8                          # K: ring slots, the most the fastest job runs ahead
    straggler_timeout: float = 300.0        # s a job may block a full ring before it is detached
    linger: float = 600.0                   # with epochs: s to wait for a job that left with epochs to go
    min_jobs: int = 1                       # jobs a group waits for before its first batch
    join_window: float = 5.0                # s with no new job before a group's first batch
    hello_timeout: float = 10.0             # s a connection may stay open without attaching
    shuffle: bool = True
    drop_last: bool = False
    on_error: str = "raise"                 # a bad image: "raise" (in the jobs) or "skip"
    backend: str = "cpu"                    # "cpu": coordl's pipeline; "dali": pipelines/dali.py
    dali_device: str = "cpu"                # with backend "dali": "cpu" or "gpu" (nvJPEG, device 0)
    storage_options: dict | None = field(default=None, repr=False)  # data at a URL: its filesystem's options
    dataset: str | None = None              # "pkg.mod:Class", a coordl.CoordlDataset to serve instead of `data`
    dataset_args: dict | None = None        # ... its keyword arguments (--dataset-args JSON)

    def __post_init__(self) -> None:
        self._check_backend()
        if bool(self.data) == bool(self.dataset):
            raise ConfigError("coordl serve needs one of --data DIR (an ImageFolder) or --dataset pkg.mod:Class "
                              f"(your coordl.CoordlDataset), got {'both' if self.data else 'neither'}")
        if self.dataset_args is not None and not (self.dataset and isinstance(self.dataset_args, dict)):
            raise ConfigError("--dataset-args must be a JSON object, and goes with --dataset pkg.mod:Class")
        if self.dataset and self.backend != "cpu":
            raise ConfigError(f"--dataset {self.dataset} --backend {self.backend}: a user's dataset preps with its "
                              "own prep on the CPU backend: drop --backend")
        if self.transform not in names.TRANSFORMS:
            raise ConfigError(f"--transform {self.transform!r}: use 'train' or 'val'")
        if self.on_error not in names.ON_ERROR:
            raise ConfigError(f"--on-error {self.on_error!r}: use 'raise' or 'skip'")
        for name, low in (("batch_size", 1), ("size", 1), ("workers", 1), ("slots", 2),
                          ("min_jobs", 1)):
            value = getattr(self, name)
            if name == "size" and value is None:
                continue
            if not (isinstance(value, int) and value >= low):
                raise ConfigError(f"--{name.replace('_', '-')} {value!r}: must be an integer >= {low}")
        if self.epochs is not None and self.epochs < 1:
            raise ConfigError(f"--epochs {self.epochs}: must be >= 1 (omit it to serve until stopped)")
        if not self.straggler_timeout > 0:
            raise ConfigError(f"--straggler-timeout {self.straggler_timeout}: must be > 0 seconds")
        if not self.linger >= 0:
            raise ConfigError(f"--linger {self.linger}: must be >= 0 seconds (0: stop as soon as "
                              "every job has left)")
        if not self.hello_timeout > 0:
            raise ConfigError(f"--hello-timeout {self.hello_timeout}: must be > 0 seconds")
        if not self.join_window >= 0:
            raise ConfigError(f"--join-window {self.join_window}: must be >= 0 seconds "
                              "(0: hand out the first batch as soon as a job asks)")
        check_socket_path(self.socket)

    @property
    def image_size(self) -> int:
        """The ImageFolder's output size (--data): --size, by default 224."""
        return 224 if self.size is None else self.size

    def _check_backend(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend {self.backend!r}: use 'cpu' (coordl's pipeline, the default) "
                              "or 'dali' (NVIDIA DALI)")
        if self.dali_device not in DALI_DEVICES:
            raise ConfigError(f"--dali-device {self.dali_device!r}: use 'cpu' or 'gpu'")
        if self.backend != "dali":
            if self.dali_device != "cpu":
                raise ConfigError(f"--dali-device {self.dali_device} needs --backend dali (the CPU "
                                  "backend has no device): add --backend dali, or drop --dali-device")
            return
        # found, not imported: the daemon forks its workers, and DALI is only loaded in them
        if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
            from coordl.pipelines.dali import INSTALL_HINT

            raise ConfigError(f"--backend dali needs NVIDIA DALI, which is not installed: "
                              f"{INSTALL_HINT}, or leave --backend unset for the CPU pipeline")


def check_cuda_devices() -> None:
    """Refuse --dali-device gpu where DALI sees no CUDA device. Asked in a child process: CUDA
    initialized in the daemon would not survive the fork of its prep workers."""
    probe = "from nvidia.dali.backend import GetCUDADeviceCount as n; print(int(n()))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    count = done.stdout.strip()
    if done.returncode != 0 or not count.isdigit():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CoordlError(f"--dali-device gpu: cannot ask DALI for CUDA devices ({last}): check the "
                          "NVIDIA DALI install (pip install -e '.[dali]' from a clone), or use --dali-device cpu")
    if int(count) == 0:
        raise CoordlError("--dali-device gpu, but DALI sees no CUDA device (no GPU, no NVIDIA driver, "
                          "or CUDA_VISIBLE_DEVICES hides them): use --dali-device cpu")
