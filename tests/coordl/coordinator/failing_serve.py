"""`coordl serve` with one handler bug, for the test that an error in one connection closes
only that connection: a Release of a negative batch index raises inside the daemon's handler.

    python failing_serve.py serve --data DIR --batch-size 4 ...   (the `coordl` arguments)
"""

import sys

from coordl.cli import commands as cli
from coordl.coordinator import daemon
from coordl.coordinator import protocol as p


class FailingDaemon(daemon.Daemon):
    def _handle(self, conn, msg):
        if isinstance(msg, p.Release) and msg.index < 0:
            raise RuntimeError(f"a bug in the handler of {msg.TYPE!r}, forced by the test")
        return super()._handle(conn, msg)


daemon.Daemon = FailingDaemon  # cli_serve looks it up when `serve` runs

if __name__ == "__main__":
    sys.exit(cli.main())
