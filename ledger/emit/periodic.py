"""A daemon thread that emits into a run's chain every `interval` seconds until stopped: the base of the
heartbeat (`runledger.ledger.emit.heartbeat`) and the system sampler (`runledger.system`). An emit that
fails is skipped with a debug line, never raised into the training loop."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Periodic:
    """Calls `tick()` every `interval` seconds on a daemon thread named `name`, from `start()` to `stop()`."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def begin(self) -> None:
        """Once, on the thread, before the first interval (e.g. a counter's baseline)."""

    def tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        self.begin()
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception as err:  # (a full spool, a sample that fails): skipped, never raised into the loop
                log.debug("%s skipped: %s", self._thread.name, err)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
