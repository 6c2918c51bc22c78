"""Start a coordl command or a Python script as a forked copy of this test process: a real
process, as `subprocess.Popen` starts it, minus the interpreter start and `import torch`
(~2-3 s of CPU each on the test machines; the coordinator tests start a daemon and one to
three jobs per test, so that was most of what they cost).

`Forked` answers the part of Popen's interface the tests use (pid, stdin, stdout, stderr, poll,
wait, send_signal, terminate, kill, returncode, communicate). The child's stdout and stderr are
pipes, /dev/null (DEVNULL) or a file the caller opened, its stdin /dev/null or a pipe, its argv and environment are
what was asked, and it ends as an interpreter ends: its own atexit functions, then its non-daemon
threads, then os._exit with the exit code (SystemExit's code; 1 after an uncaught exception,
printed to its stderr). Nothing of this process's pytest state runs in it: the atexit functions
inherited are dropped, the root logger's handlers (pytest's capture) removed, pytest-timeout's
SIGALRM handler reset.

What a forked child shares with this process that an exec'd one would not: modules already
imported (and their state, e.g. a pool made before the fork: coordl's fork guards make those
anew in a child), and copies of its open file descriptors (left open: an object of this process
that the child's garbage collector finalizes closes its own copy, never a descriptor the child
has opened since). Tests that are about the command line as a user runs it (argument parsing,
entry points, the first import) keep starting the real executable.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

PIPE = subprocess.PIPE


class Forked:
    """A forked child running `target()` with the given argv, environment and standard streams."""

    def __init__(self, target: Callable[[], object], argv: list[str], *, stdin=None, stdout=None, stderr=None,
                 env: dict | None = None, cwd: str | os.PathLike | None = None, text: bool = True,
                 start_new_session: bool = False) -> None:
        self.args, self.returncode = argv, None
        ends: dict[int, int] = {}   # the child's fd 0/1/2 -> the descriptor to put there
        mine: dict[int, int] = {}   # this process's ends of the pipes
        made: list[int] = []        # descriptors made here for the child only (closed after the fork)
        for fd, where in ((0, stdin), (1, stdout), (2, stderr)):
            if where == PIPE:
                r, w = os.pipe()
                (ends[fd], mine[fd]) = (r, w) if fd == 0 else (w, r)
                made.append(ends[fd])
            elif where == subprocess.DEVNULL:
                ends[fd] = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
                made.append(ends[fd])
            elif where is not None:
                ends[fd] = where if isinstance(where, int) else where.fileno()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                if start_new_session:
                    os.setsid()
                for fd, src in ends.items():
                    os.dup2(src, fd)
                for end in [*mine.values(), *made]:  # this process's ends; the originals now at 0-2
                    os.close(end)
                if 0 not in ends:
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)  # (xdist's channel is this test process's stdin)
                    os.close(null)
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (pytest-timeout's handler)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                sys.stdin = open(0, closefd=False)
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
                sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                    # PYTHONPATH's folders first on sys.path, as a new interpreter puts them
                    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
                sys.argv = list(argv)
                if cwd is not None:
                    os.chdir(cwd)
                # logging as in a new interpreter: no handler (pytest's capture handlers are on
                # this process's root logger, and basicConfig adds nothing while one is there)
                for handler in list(logging.root.handlers):
                    logging.root.removeHandler(handler)
                logging.root.setLevel(logging.WARNING)
                atexit._clear()  # this test process's own (pytest's) exit functions
                try:
                    target()
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                    if not isinstance(e.code, int) and e.code is not None:
                        print(e.code, file=sys.stderr)
                except BaseException:  # noqa: BLE001 (printed, as the interpreter prints it; exit 1)
                    traceback.print_exc()
                    code = 1
                atexit._run_exitfuncs()
                threading._shutdown()  # pyright: ignore[reportAttributeAccessIssue] (what interpreter exit does)
            except BaseException:  # noqa: BLE001 (the child must reach os._exit whatever happened)
                with contextlib.suppress(BaseException):
                    traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        self.pid = pid
        for end in made:
            os.close(end)
        self.stdin = os.fdopen(mine[0], "w" if text else "wb") if 0 in mine else None
        self.stdout = os.fdopen(mine[1], "r" if text else "rb") if 1 in mine else None
        self.stderr = os.fdopen(mine[2], "r" if text else "rb") if 2 in mine else None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)  # pyright: ignore[reportArgumentType]
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple:
        """(stdout, stderr) read to their ends, each on a thread (neither pipe fills); then the exit.
        subprocess.TimeoutExpired when the child has not closed them and exited within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        got: dict[int, object] = {}
        readers = []
        for n, stream in ((1, self.stdout), (2, self.stderr)):
            if stream is not None:
                readers.append(threading.Thread(target=lambda n=n, f=stream: got.__setitem__(n, f.read()), daemon=True))
                readers[-1].start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)  # pyright: ignore[reportArgumentType]
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return got.get(1), got.get(2)


def coordl(args: list[str], **kw) -> Forked:
    """`coordl ARGS...` (the console script's `main`) in a forked child."""
    from coordl.cli.commands import main
    return Forked(lambda: main(args=args, prog_name="coordl"), ["coordl", *args], **kw)


def script(path: str, args: list[str], **kw) -> Forked:
    """`python PATH ARGS...` in a forked child (run as __main__)."""
    def run() -> None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        runpy.run_path(path, run_name="__main__")
    return Forked(run, [path, *args], **kw)


def run(args: list[str], timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    """`subprocess.run(["coordl", *args], capture_output=True, text=True, ...)`, forked."""
    child = coordl(args, stdout=PIPE, stderr=PIPE, **kw)
    try:
        out, err = child.communicate(timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)  # pyright: ignore[reportArgumentType]
