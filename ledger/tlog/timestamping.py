"""The ledger asking a time-stamping authority (RFC 3161, $RUNLEDGER_TLOG_TSA) to stamp its checkpoints:
after each signed checkpoint, its text is sent (SHA-256) and the reply, once it checks against the
authority's certificates ($RUNLEDGER_TLOG_TSA_CERTS), is kept at `tlog/timestamp/<size>.tsr`
(runledger.ledger.tlog.timestamps).

In a background thread: ingest never waits for the authority. Only the newest checkpoint is asked for,
at most once every EVERY_S (an authority's fair use; the newest checkpoint waiting is asked when the
interval ends, so the last one of a run is stamped too). An authority that fails is asked again after a
pause that doubles up to RETRY_MAX_S, said once in the ledger's log per failure streak, and again when
it stamps."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from runledger.ledger.tlog import checkpoint, note
from runledger.ledger.tlog.timestamps import Authority, TimestampRefused, from_env, path_of

log = logging.getLogger(__name__)

EVERY_S = 60.0  # the most often the authority is asked (public authorities ask for fair use)
EVERY_ENV = "RUNLEDGER_TLOG_TSA_EVERY_S"  # another interval, for an authority of one's own
RETRY_S = 1.0  # the first pause after a failure; it doubles up to RETRY_MAX_S
RETRY_MAX_S = 60.0


class Timestamping:
    """The timestamps of one log (its public folder `log_dir`), asked of `authority`; `keep(path, reply)`
    writes a reply durably (runledger.ledger.tlog.log's write_file)."""

    def __init__(self, log_dir: Path, authority: Authority, keep: Callable[[Path, bytes], None],
                 every_s: float = EVERY_S) -> None:
        self.dir, self.authority, self.keep, self.every_s = log_dir, authority, keep, every_s  # (a Path or ObjectPath)
        self.retry_s = RETRY_S
        self.failing: str | None = None  # why, while the authority fails
        self.stamped: list[int] = []  # the sizes stamped by this process, in order
        self._cond = threading.Condition()
        self._pending: str | None = None
        self._fresh = False  # a checkpoint submitted and not tried yet (a retry is not fresh)
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=f"tlog-timestamping {self.dir}", daemon=True)
        self._thread.start()

    def submit(self, signed: str) -> None:
        """Ask for a token on `signed` soon (replacing a checkpoint not asked for yet)."""
        with self._cond:
            self._pending, self._fresh = signed, True
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every checkpoint submitted was asked for at least once (tests); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._fresh and not self._busy, timeout)

    def _run(self) -> None:
        next_at, pause = 0.0, self.retry_s
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                while time.monotonic() < next_at:  # (a newer checkpoint may come meanwhile: it replaces this one)
                    self._cond.wait(next_at - time.monotonic())
                signed, self._pending, self._busy, self._fresh = self._pending, None, True, False
            ok = False
            try:
                ok = self.stamp(signed)
            except Exception:  # (never the thread's end)
                log.exception("stamping a checkpoint of %s failed", self.dir)
            with self._cond:
                if ok:
                    next_at, pause = time.monotonic() + self.every_s, self.retry_s
                else:
                    if self._pending is None:  # asked again after the pause, unless a newer one came
                        self._pending = signed
                    next_at, pause = time.monotonic() + pause, min(pause * 2, RETRY_MAX_S)
                self._busy = False
                self._cond.notify_all()

    def stamp(self, signed: str) -> bool:
        """Ask for a token on checkpoint `signed` and keep it; False (said once per streak) if none came."""
        text = note.signatures(signed)[0]
        cp = checkpoint.Checkpoint.parse(text)
        path = self.dir / path_of(cp.size)
        if cp.size == 0 or path.exists():  # (an empty log's checkpoint stamps no event)
            return True
        try:
            reply, stamp = self.authority.request(text, cp.size)
        except TimestampRefused as err:
            if self.failing is None:
                log.warning("the time-stamping authority %s did not stamp %s size %d: %s; asked again, then with "
                            "each new checkpoint", self.authority.url, cp.origin, cp.size, err)
            self.failing = str(err)
            return False
        self.keep(path, reply)
        self.stamped.append(cp.size)
        if self.failing is not None:
            log.info("the time-stamping authority %s stamps %s again (size %d, %s)", self.authority.url, cp.origin,
                     cp.size, stamp.gen_time.isoformat())
            self.failing = None
        return True


def for_log(log_dir: Path, keep: Callable[[Path, bytes], None]) -> Timestamping | None:
    """The timestamping of a log per $RUNLEDGER_TLOG_TSA; None when unset. A configuration that does not
    load is said in one line, and the log goes on unstamped."""
    try:
        authority = from_env()
    except TimestampRefused as err:
        log.error("the transparency log's checkpoints are not timestamped: %s", err)
        return None
    if authority is None:
        return None
    try:
        every = float(os.environ.get(EVERY_ENV, EVERY_S))
    except ValueError:
        log.warning("$%s is not a number of seconds; the authority is asked at most every %s s", EVERY_ENV, EVERY_S)
        every = EVERY_S
    return Timestamping(log_dir, authority, keep, every)
