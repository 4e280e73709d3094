"""Liveness: a thread that emits a `heartbeat` event into a run's chain every interval while its process
lives (`runledger.init`'s run, the trainer's worker), so that a run whose process died without a
`run_finished` reads `crashed`, not `running` (the contract's RUN_STATES, the `runs` view's `state`).

The interval is HEARTBEAT_S, or $RUNLEDGER_HEARTBEAT_S (tests make it short). A beat is sealed like any
event (the sink's lock, held for microseconds): it never holds up `log`, and a beat that fails is
skipped with a debug line, never raised into the loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

log = logging.getLogger(__name__)

HEARTBEAT_ENV = "RUNLEDGER_HEARTBEAT_S"
HEARTBEAT_S = 30.0  # (Levanter's phase heartbeat is of the same order)


def interval_s() -> float:
    """$RUNLEDGER_HEARTBEAT_S if it is a number > 0, else HEARTBEAT_S."""
    try:
        value = float(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_S)
    except ValueError:
        return HEARTBEAT_S
    return value if 0 < value < float("inf") else HEARTBEAT_S


class Heartbeat:
    """Emits `heartbeat` into `sink` every `interval` seconds, until `stop()`."""

    def __init__(self, sink, interval: float | None = None) -> None:
        self.sink, self.interval = sink, interval or interval_s()
        self.payload = {"host": socket.gethostname(), "pid": os.getpid(), "interval_s": float(self.interval)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="runledger-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sink.emit_dict("heartbeat", self.payload)
            except Exception as err:  # (a full spool, say): skipped, never raised into the loop
                log.debug("heartbeat skipped: %s", err)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
