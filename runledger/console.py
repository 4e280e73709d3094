"""The script's console in the run: what it writes to stdout and stderr, line by line, as `console` events.

`runledger.init` starts a `Console` (on by default, as W&B's console capture is; `init(console=False)`, or W&B's
`settings=Settings(console="off")`, turns it off): `sys.stdout` and `sys.stderr` are wrapped so that each write goes
to the terminal as before and its lines are kept too; a thread sends them every FLUSH_S as `console` events (at most
MAX_CONSOLE_LINES lines and BATCH_BYTES of text each), at the step the run is at. `finish` sends what is left (a last
line without its newline too) and puts the streams back.

Bounded: a line is cut to MAX_CONSOLE_LINE characters (counted in the event's `cut`); past RATE lines a second on
average (a burst of BURST at once) lines are left out and counted in the next event's `dropped`, so a print loop
that floods the console costs the run a counter, not its memory or its ledger. A carriage return (a progress
bar redrawing its line) keeps what follows it, as the terminal shows it. Writes from the Python level are
kept (print, logging's stream handlers, tracebacks); what C code or a child process writes to the file
descriptors directly is not.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

log = logging.getLogger("runledger")

# The contract's bounds (`runledger.ledger.contract.events`), repeated so that `import runledger` loads no pydantic
# (tests/unit/test_console.py holds them equal)
MAX_CONSOLE_LINE = 4096
MAX_CONSOLE_LINES = 1000
BATCH_BYTES = 256 << 10  # of one event's lines (MAX_EVENT_BYTES is 1 MiB)
FLUSH_S = 1.0
RATE = 1000.0  # lines a second, on average
BURST = 10_000  # lines at once (also the most a stream keeps waiting for the next flush)
STREAMS = ("stdout", "stderr")


def wanted(console: Any, settings: Any) -> bool:
    """Whether init captures the console: `console=` (default True), unless W&B's settings say console="off"."""
    if console is not None:
        return bool(console)
    given = settings.get("console") if isinstance(settings, dict) else getattr(settings, "console", None)
    return str(given).lower() not in ("off", "false", "0") if given is not None else True


class _Stream:
    """One stream's lines waiting to be sent (a run of lines left out kept as their count, in its place), its
    partial last line, the number of the next line to send, and its rate bound."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.partial = ""
        self.waiting: list[str | int] = []  # lines, and counts of lines left out between them
        self.kept = 0  # lines among `waiting`
        self.next = 0  # the number of the first waiting line (or left-out line)
        self.tokens, self.at = float(BURST), time.monotonic()

    def add(self, text: str) -> None:
        *done, self.partial = (self.partial + text).split("\n")
        if len(self.partial) > 4 * MAX_CONSOLE_LINE:  # (a line with no end yet: its start is what is kept)
            self.partial = self.partial[: 2 * MAX_CONSOLE_LINE]
        if not done:
            return
        now = time.monotonic()
        self.tokens, self.at = min(float(BURST), self.tokens + (now - self.at) * RATE), now
        for line in done:
            if self.tokens >= 1.0 and self.kept < BURST:
                self.tokens -= 1.0
                self.kept += 1
                self.waiting.append(line)
            elif self.waiting and type(self.waiting[-1]) is int:
                self.waiting[-1] += 1
            else:
                self.waiting.append(1)

    def take(self, final: bool) -> list[dict]:
        """The waiting lines as payloads, in order (with `final`, the partial line too)."""
        if final and self.partial:
            self.waiting.append(self.partial)
            self.partial = ""
        out: list[dict] = []
        batch: list[str] = []
        dropped = size = cut = 0

        def close() -> None:
            nonlocal batch, dropped, size, cut
            payload: dict = {"stream": self.name, "first": self.next + dropped, "lines": batch}
            if dropped:
                payload["dropped"] = dropped
            if cut:
                payload["cut"] = cut
            out.append(payload)
            self.next += dropped + len(batch)
            batch, dropped, size, cut = [], 0, 0, 0

        for item in self.waiting:
            if type(item) is int:
                if batch:
                    close()
                dropped += item
                continue
            if len(batch) == MAX_CONSOLE_LINES or size >= BATCH_BYTES:
                close()
            line = item.rstrip("\r").rsplit("\r", 1)[-1] if "\r" in item else item
            if len(line) > MAX_CONSOLE_LINE:
                line, cut = line[:MAX_CONSOLE_LINE], cut + 1
            line = line.encode("utf-8", "replace").decode("utf-8")  # (a lone surrogate is no JSON text)
            batch.append(line)
            size += len(line) + 8
        if batch or dropped:
            close()
        self.waiting, self.kept = [], 0
        return out


class _Tee:
    """A text stream that writes through to the one it wraps and hands each write's text to the capture."""

    def __init__(self, wrapped: Any, stream: _Stream, lock: threading.Lock) -> None:
        self._wrapped, self._stream, self._lock = wrapped, stream, lock

    def write(self, text: str) -> int:
        n = self._wrapped.write(text)
        if isinstance(text, str) and text:
            with self._lock:
                self._stream.add(text)
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer, ...
        return getattr(self._wrapped, name)


class Console:
    """The capture of one run's console (see the module docstring): `start()`, then `stop()` at finish."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.lock = threading.Lock()
        self.streams = {name: _Stream(name) for name in STREAMS}
        self.tees: dict[str, _Tee] = {}
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.stopped = False

    def start(self) -> "Console":
        for name in STREAMS:
            wrapped = getattr(sys, name)
            if wrapped is None:
                continue
            self.tees[name] = _Tee(wrapped, self.streams[name], self.lock)
            setattr(sys, name, self.tees[name])
        self.thread = threading.Thread(target=self._flushing, name="runledger-console", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Send what is left and put the streams back (one replaced since by someone else is left as it is)."""
        if self.stopped:
            return
        self.stopped = True
        self.wake.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(10.0)
        for name, tee in self.tees.items():
            if getattr(sys, name) is tee:
                setattr(sys, name, tee._wrapped)
        self.send(final=True)

    def _flushing(self) -> None:
        while not self.wake.wait(FLUSH_S):
            self.send(final=False)

    def send(self, final: bool) -> None:
        with self.lock:
            payloads = [p for s in self.streams.values() for p in s.take(final)]
        step = self.run.step - 1 if self.run.step else None
        for payload in payloads:
            try:
                self.run._sink.emit_dict("console", payload, step)
            except Exception as err:  # (never into the loop: the lines are lost, said once)
                from runledger.wandb_compat import skipped

                skipped("console lines that cannot be sent", f"{type(err).__name__}: {str(err)[:200]}")
