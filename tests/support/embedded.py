"""embedded: a root on `runledger.init`'s embedded default (no server configured) as the tests drive it: its
processes' environment, its server idling out, and a run whose steps a test logs one at a time (tests/support:
every helper defined once)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from runledger.ledger import local
from runledger.ledger.bus import natsserver
from support import REPO

WATCHDOG_S = 120  # generous: a first nats-server, ledger and run on a loaded machine


def embedded_env(root: Path, **extra: str) -> dict:
    """A process on the embedded default of `root`: no server configured, a short idle time."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    return {**env, "RUNLEDGER_ROOT": str(root), "RUNLEDGER_IDLE_S": "1", "PYTHONPATH": str(REPO), **extra}


def until(what, timeout: float = WATCHDOG_S, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(every)
    return got


def idled_out(root: Path) -> str:
    """Wait for the root's embedded server to stop by itself (no client left); returns the URL it had,
    and keeps its port taken (a listening socket, returned too) so that the next one is sure to differ."""
    url = local.running_url(root)
    assert url, "the root's embedded server is not up"
    assert until(lambda: local.running_url(root) is None and natsserver.running_url(root) is None), \
        (root / "local" / "supervisor.log").read_text()
    port = int(url.rsplit(":", 1)[1])
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", port))
    taken.listen(1)
    return url, taken


STEERED_RUN = """
import runledger, sys
run = runledger.init(project="live", name=sys.argv[1], system_metrics=False)
print(run.id, flush=True)
for line in sys.stdin:
    if line.strip() == "finish":
        break
    step = int(line)
    run.log({"loss": 1.0 / (1 + step)}, step=step)
    print(step, flush=True)
run.finish()
print("finished", flush=True)
"""


class SteeredRun:
    """A user's script on the embedded default of `root`, in its own process: `runledger.init`, then one
    `run.log` per `log(step)` (its `loss`), then `finish()` (`run.finish`, and the process ends)."""

    def __init__(self, root: Path, name: str, **env: str):
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(STEERED_RUN), name], cwd=REPO,
                                     env=embedded_env(root, RUNLEDGER_HEARTBEAT_S="3600", **env), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.id = self._said()

    def _said(self) -> str:
        line = self.proc.stdout.readline().strip()  # (bounded by the caller's watchdog: the process ends on its own error)
        assert line, self.proc.stderr.read() if self.proc.poll() is not None else "the run said nothing"
        return line

    def log(self, step: int) -> None:
        """Log `step` and return once `run.log` returned."""
        self.proc.stdin.write(f"{step}\n")
        self.proc.stdin.flush()
        assert self._said() == str(step)

    def finish(self, timeout: float = WATCHDOG_S) -> None:
        self.proc.stdin.write("finish\n")
        self.proc.stdin.close()
        assert self.proc.wait(timeout) == 0, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
