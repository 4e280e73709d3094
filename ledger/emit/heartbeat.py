"""Liveness: a thread that emits a `heartbeat` event into a run's chain every interval while its process
lives (`runledger.init`'s run, the trainer's worker), so that a run whose process died without a
`run_finished` reads `crashed`, not `running` (the contract's RUN_STATES, the `runs` view's `state`).

The interval is HEARTBEAT_S, or $RUNLEDGER_HEARTBEAT_S (tests make it short). A beat is sealed like any
event (the sink's lock, held for microseconds): it never holds up `log`, and a beat that fails is
skipped with a debug line, never raised into the loop.
"""

from __future__ import annotations

import os
import socket

from runledger.ledger.emit.periodic import Periodic

HEARTBEAT_ENV = "RUNLEDGER_HEARTBEAT_S"
HEARTBEAT_S = 30.0  # (Levanter's phase heartbeat is of the same order)


def interval_s() -> float:
    """$RUNLEDGER_HEARTBEAT_S if it is a number > 0, else HEARTBEAT_S."""
    try:
        value = float(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_S)
    except ValueError:
        return HEARTBEAT_S
    return value if 0 < value < float("inf") else HEARTBEAT_S


class Heartbeat(Periodic):
    """Emits `heartbeat` into `sink` every `interval` seconds, until `stop()`."""

    def __init__(self, sink, interval: float | None = None) -> None:
        super().__init__(interval or interval_s(), "runledger-heartbeat")
        self.sink = sink
        self.payload = {"host": socket.gethostname(), "pid": os.getpid(), "interval_s": float(self.interval)}

    def tick(self) -> None:
        self.sink.emit_dict("heartbeat", self.payload)
