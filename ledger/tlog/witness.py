"""A C2SP tlog-witness (c2sp.org/tlog-witness): `POST <prefix>/add-checkpoint` with an old size, a
consistency proof and a signed checkpoint; the witness checks the checkpoint's signature against the
log keys it was given, checks the checkpoint extends the latest one it cosigned for that origin, keeps
it, and answers with its cosignature (runledger.ledger.tlog.cosignature). `runledger witness serve`.

Answers, as the spec has them: 200 and the cosignature line; 400 for a malformed request (or an old
size above the checkpoint's); 403 when no signature by a key of the log verifies; 404 for an origin
it has no key for; 409 (`text/x.tlog.size`, the size it has) when the old size is not the size it
cosigned last, or the same size comes with another root; 422 when the consistency proof fails.

Never rolls back, never forgets: per origin, the latest cosigned checkpoint is a file of the state
folder (written whole: temp file, fsync, rename, fsync of the folder) before any cosignature on it
leaves; the check and the write happen under one lock, so two requests cannot interleave (the race
the spec warns of). A state file is never removed, even when its log's key is no longer given.
One witness process per state folder (an OS lock, released when the process dies)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from runledger.ledger.storage import locks
from runledger.ledger.tlog import checkpoint, merkle, note
from runledger.ledger.tlog.cosignature import Cosigner
from runledger.ledger.tlog.log import write_file

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Answer:
    status: int
    text: str
    content_type: str = "text/plain; charset=utf-8"


class Witness:
    """A witness's state (`state_dir`), key and the log keys it cosigns for. A log is known by its
    origin: a key's name, or (runledger's partitioned ledgers) the key's name then `/p<N>`."""

    def __init__(self, state_dir: str | Path, cosigner: Cosigner, logs: list[note.Verifier]) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._held = locks.hold(self.dir / "witness.lock", f"witness state {self.dir}")
        self.cosigner, self.logs = cosigner, logs
        self._lock = threading.Lock()
        for origin, size in self.known().items():
            if not self.keys_of(origin):
                log.warning("witness: no key given for log %s (size %d cosigned before): its state is kept", origin, size)

    def close(self) -> None:
        """Let another witness process take the state folder."""
        self._held.release()

    def keys_of(self, origin: str) -> list[note.Verifier]:
        return [v for v in self.logs if origin == v.name or re.fullmatch(re.escape(v.name) + r"/p[0-9]+", origin)]

    def known(self) -> dict[str, int]:
        """{origin: size} of every log this witness cosigned."""
        out = {}
        for p in sorted(self.dir.glob("*.json")):
            state = json.loads(p.read_text())
            out[state["origin"]] = state["size"]
        return out

    def _path(self, origin: str) -> Path:
        return self.dir / (hashlib.sha256(origin.encode()).hexdigest()[:32] + ".json")

    def _state(self, origin: str) -> tuple[int, bytes | None]:
        try:
            state = json.loads(self._path(origin).read_text())
        except FileNotFoundError:
            return 0, None
        return state["size"], base64.b64decode(state["root"])

    def _save(self, cp: checkpoint.Checkpoint, signed: str) -> None:
        write_file(self._path(cp.origin), json.dumps({"origin": cp.origin, "size": cp.size, "checkpoint": signed,
                                                      "root": base64.b64encode(cp.root).decode()}, sort_keys=True).encode())

    def add_checkpoint(self, body: bytes) -> Answer:
        """The answer to one add-checkpoint request body."""
        try:
            old, proof, signed = checkpoint.parse_add_checkpoint(body)
        except ValueError as err:
            return Answer(400, f"{err}\n")
        origin = signed.split("\n", 1)[0]
        keys = self.keys_of(origin)
        if not keys:
            return Answer(404, f"unknown log {origin[:100]!r}\n")
        try:
            text, _ = note.open_note(signed, keys)
        except note.NoteError as err:
            return Answer(403, f"{err}\n")
        try:
            cp = checkpoint.Checkpoint.parse(text)
        except note.NoteError as err:
            return Answer(400, f"{err}\n")
        if old > cp.size:
            return Answer(400, f"old size {old} is above the checkpoint's size {cp.size}\n")
        with self._lock:
            return self._check_and_cosign(old, proof, cp, signed, text)

    def _check_and_cosign(self, old: int, proof: list[bytes], cp: checkpoint.Checkpoint, signed: str,
                          text: str) -> Answer:
        size, root = self._state(cp.origin)
        if old != size:
            return Answer(409, f"{size}\n", checkpoint.SIZE_TYPE)
        if old == cp.size and old and root != cp.root:
            log.warning("witness: log %s signed two roots for size %d (a fork); not cosigning: %s",
                        cp.origin, old, base64.b64encode(cp.root).decode())
            return Answer(409, f"{size}\n", checkpoint.SIZE_TYPE)
        try:
            if old == 0 or old == cp.size:
                if proof:
                    raise merkle.ProofError("the proof of an old size of 0, or of the same size, is empty")
            else:
                merkle.verify_consistency(old, cp.size, root, cp.root, proof)
        except merkle.ProofError as err:
            log.warning("witness: log %s: checkpoint size %d does not extend size %d it cosigned (%s); signed: %r",
                        cp.origin, cp.size, old, err, signed)
            return Answer(422, f"the consistency proof from size {old} does not verify: {err}\n")
        self._save(cp, signed)
        return Answer(200, self.cosigner.cosign(text))


def app(witness: Witness):
    """The witness as an ASGI app: POST /add-checkpoint; GET / says its verifier key."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    async def add_checkpoint(request):
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > checkpoint.MAX_REQUEST:
                return PlainTextResponse(f"a request larger than {checkpoint.MAX_REQUEST} bytes\n", 400)
        a = await run_in_threadpool(witness.add_checkpoint, body)  # (fsync: off the event loop)
        return Response(a.text, a.status, headers={"content-type": a.content_type})  # (as is: no charset added)

    async def about(request):
        return PlainTextResponse(f"C2SP tlog-witness {witness.cosigner.verifier.text()}\n")

    return Starlette(routes=[Route("/add-checkpoint", add_checkpoint, methods=["POST"]), Route("/", about)])
