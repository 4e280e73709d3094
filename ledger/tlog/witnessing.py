"""The ledger asking witnesses for cosignatures (c2sp.org/tlog-witness): after each signed checkpoint,
each witness of the policy ($RUNLEDGER_TLOG_POLICY, a C2SP tlog-policy file) that has a URL is sent the
checkpoint with a consistency proof from the size it cosigned last (0 at first; on 409, the size it
answers, once). Its cosignature lines are appended to the checkpoint's note in `tlog/checkpoint`, as
C2SP has cosigned checkpoints, while that file still holds the checkpoint cosigned.

In a background thread: ingest never waits for a witness. Only the newest checkpoint is asked for (a
witness that was down is asked again with the next one); a witness that fails is said once in the
ledger's log per failure streak, and again when it cosigns."""

from __future__ import annotations

import http.client
import logging
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Callable

from runledger.ledger.tlog import checkpoint, merkle, note, policy, tiles
from runledger.ledger.tlog.cosignature import cosigners

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0  # one add-checkpoint request; a witness slower than that is taken as down this round
MAX_ANSWER = 1 << 16  # the most of an answer read (a few cosignature lines are ~150 bytes each)


class WitnessFailed(Exception):
    """A witness that gave no valid cosignature this round; one line."""


class Witnessing:
    """The witnesses of one log (its public folder `log_dir`); `attach(signed, lines)` adds cosignature
    lines to its checkpoint file if it still holds `signed`'s checkpoint (runledger.ledger.tlog.log's)."""

    def __init__(self, log_dir: Path, pol: policy.Policy, attach: Callable[[str, list[str]], bool]) -> None:
        self.dir, self.attach = Path(log_dir), attach
        self.witnesses = [w for w in pol.witnesses.values() if w.url]
        self.known = {w.name: 0 for w in self.witnesses}  # the size each witness cosigned last (as it told us)
        self.failing: dict[str, str] = {}  # witness -> why, while it fails
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._cond = threading.Condition()
        self._pending: str | None = None
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=f"tlog-witnessing {self.dir}", daemon=True)
        self._thread.start()

    # -- the background thread --

    def submit(self, signed: str) -> None:
        """Ask for cosignatures on `signed` soon (replacing a checkpoint not asked for yet)."""
        with self._cond:
            self._pending = signed
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every checkpoint submitted was asked for (tests, the bench); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                signed, self._pending, self._busy = self._pending, None, True
            try:
                self.cosign(signed)
            except Exception:  # (never the thread's end: the next checkpoint is asked for again)
                log.exception("asking the witnesses to cosign a checkpoint of %s failed", self.dir)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    # -- one round --

    def cosign(self, signed: str) -> list[str]:
        """Ask every witness for its cosignature on `signed`, attach those given; returns their lines."""
        cp = checkpoint.Checkpoint.parse(note.signatures(signed)[0])
        reader = tiles.Tiles(self.dir)
        lines = []
        for w in self.witnesses:
            try:
                lines.append(self._ask(w, cp, signed, reader))
            except WitnessFailed as err:
                if w.name not in self.failing:
                    log.warning("witness %s (%s) did not cosign %s size %d: %s; asked again with each new checkpoint",
                                w.name, w.url, cp.origin, cp.size, err)
                self.failing[w.name] = str(err)
                continue
            if self.failing.pop(w.name, None) is not None:
                log.info("witness %s cosigns %s again (size %d)", w.name, cp.origin, cp.size)
        if lines and not self.attach(signed, lines):
            log.debug("%s: a newer checkpoint was signed meanwhile; its own round cosigns it", self.dir)
        return lines

    def _ask(self, w: policy.Witness, cp: checkpoint.Checkpoint, signed: str, reader: tiles.Tiles) -> str:
        for retry in (False, True):
            old = self.known[w.name]
            if old > cp.size:
                raise WitnessFailed(f"it cosigned size {old} of this log, larger than {cp.size}: a fork, or "
                                    f"another log with this origin")
            try:
                proof = merkle.consistency_proof(reader.node(cp.size), old, cp.size) if 0 < old < cp.size else []
            except tiles.TileMissing as err:
                raise WitnessFailed(f"no consistency proof from size {old}: {err}") from None
            status, ctype, text = self._post(w, checkpoint.add_checkpoint_body(old, proof, signed))
            if status == 409 and ctype.split(";")[0].strip() == checkpoint.SIZE_TYPE:
                try:
                    size = int(text.strip())
                except ValueError:
                    raise WitnessFailed(f"409 with a size that is not a number: {text[:40]!r}") from None
                if retry or size == old:
                    raise WitnessFailed(f"409: it cosigned size {size} of this log, and this checkpoint (size {cp.size}) "
                                        f"is not consistent with it (another history of this log?)")
                self.known[w.name] = size
                continue
            if status != 200:
                raise WitnessFailed(f"HTTP {status}: {text.strip()[:200]}")
            line = self._valid_line(w, signed, text)
            self.known[w.name] = cp.size
            return line
        raise AssertionError("a 409 is retried once, and that try returns or raises")

    @staticmethod
    def _valid_line(w: policy.Witness, signed: str, text: str) -> str:
        """The line of the answer that is `w`'s valid cosignature on `signed`."""
        body = note.signatures(signed)[0]
        for line in text.strip("\n").split("\n"):
            try:
                if cosigners(body + "\n" + line + "\n", [w.key]):
                    return line
            except note.NoteError as err:
                raise WitnessFailed(f"its answer does not check: {err}") from None
        raise WitnessFailed("its answer holds no cosignature by its key")

    def _post(self, w: policy.Witness, body: bytes) -> tuple[int, str, str]:
        """POST body to the witness's add-checkpoint (a kept-alive connection, opened again once)."""
        url = urllib.parse.urlsplit(w.url)
        path = url.path.rstrip("/") + "/add-checkpoint"
        for again in (False, True):
            conn = self._conns.get(w.name)
            if conn is None:
                cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
                conn = self._conns[w.name] = cls(url.netloc, timeout=TIMEOUT_S)
            try:
                conn.request("POST", path, body, {"Content-Type": "text/plain"})
                r = conn.getresponse()
                data = r.read(MAX_ANSWER)
                if not r.isclosed():  # (an answer longer than any witness's: not read to its end, not reused)
                    conn.close()
                    self._conns.pop(w.name, None)
                return r.status, r.getheader("Content-Type", ""), data.decode("utf-8", "replace")
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                self._conns.pop(w.name, None)
                if again:
                    raise WitnessFailed(f"unreachable ({err.__class__.__name__}: {err})") from None
        raise AssertionError("unreachable")


def from_env(log_dir: Path, verifier: note.Verifier, attach) -> Witnessing | None:
    """The witnessing of a log per $RUNLEDGER_TLOG_POLICY; None when unset or it names no witness URL.
    A policy that does not parse is said, and the log goes on unwitnessed."""
    path = os.environ.get(policy.POLICY_ENV)
    if not path:
        return None
    try:
        pol = policy.load(path)
    except policy.PolicyError as err:
        log.error("the transparency log's policy ($%s) does not parse, no witness is asked: %s", policy.POLICY_ENV, err)
        return None
    if pol.logs and verifier.public not in {v.public for v in pol.log_keys()}:
        log.warning("the policy %s does not list this log's key %s: an auditor with it will refuse the log",
                    path, verifier.text())
    if not any(w.url for w in pol.witnesses.values()):
        log.warning("the policy %s names no witness with a URL: none is asked to cosign", path)
        return None
    return Witnessing(log_dir, pol, attach)
