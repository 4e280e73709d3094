"""Exclusive locks that the OS releases when the holder dies: one ledger per root, one process per chain.

`hold(path, what)` takes `fcntl.flock(LOCK_EX | LOCK_NB)` on `path` and writes the holder (pid, host,
since when) into it. A second taker, in this process or another, gets `Busy`, a one-line error that
names the holder. The lock lives as long as the file descriptor: a SIGKILLed holder leaves no stale
lock, and the next taker succeeds at once. (A child made by fork without exec shares the descriptor,
and with it the lock.)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path


class Busy(RuntimeError):
    """Someone else holds the lock; the message names them."""


class Lock:
    """A held lock; `release()` (or the holder's death) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


PROBE_S = 0.5  # a taker that another process may be probing (is_held) waits this long for the probe


def is_held(path: Path) -> bool:
    """Whether a live process holds the lock at `path` (a lock whose holder died is free). The probe
    takes the lock for a moment: a taker it may race passes wait_s=PROBE_S to `hold`."""
    try:
        hold(path, "").release()
        return False
    except Busy:
        return True
    except FileNotFoundError:
        return False


def holder(path: Path) -> str:
    """Who holds (or last held) the lock at `path`, as text for an error message."""
    for _ in range(20):  # the holder writes its name just after taking the lock: give it a moment
        try:
            who = json.loads(Path(path).read_text() or "null")
        except (OSError, ValueError):
            who = None
        if who:
            return f"pid {who.get('pid')} on host {who.get('host')} (since {who.get('since')})"
        time.sleep(0.01)
    return "another process (its pid is not recorded yet)"


def hold(path: str | Path, what: str, wait_s: float = 0.0) -> Lock:
    """Take the exclusive lock at `path` for `what` (a phrase such as "ledger root /data"), waiting up
    to `wait_s` for its holder to let go, or raise Busy."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            os.close(fd)
            raise Busy(f"{what} is in use by {holder(path)}") from None
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    return Lock(path, fd)
