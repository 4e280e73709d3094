"""C2SP checkpoints (c2sp.org/tlog-checkpoint: origin, tree size, base64 root hash, as a signed note),
C2SP tlog-proof texts (c2sp.org/tlog-proof@v1: index, inclusion proof, the checkpoint), and the body of
a tlog-witness add-checkpoint request (c2sp.org/tlog-witness: old size, consistency proof, the checkpoint)."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from runledger.ledger.tlog import merkle, note

PROOF_HEADER = "c2sp.org/tlog-proof@v1"
MAX_PROOF = 63  # tlog-witness: the most consistency proof lines of a request
MAX_REQUEST = 1 << 16  # no request of a checkpoint and 63 hashes comes near it
SIZE_TYPE = "text/x.tlog.size"  # tlog-witness: a 409's body, the size the witness has
_OLD = re.compile(r"old (0|[1-9][0-9]*)")


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def parse(cls, text: str) -> "Checkpoint":
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or not all(lines[:-1]):
            raise note.NoteError("a checkpoint is at least three non-empty lines")
        origin, size, root = lines[:3]
        if not size.isdigit() or (size != "0" and size.startswith("0")):
            raise note.NoteError(f"the checkpoint's size is not a decimal: {size[:40]!r}")
        try:
            digest = base64.b64decode(root, validate=True)
        except binascii.Error:
            raise note.NoteError("the checkpoint's root is not base64") from None
        if len(digest) != merkle.HASH_SIZE:
            raise note.NoteError("the checkpoint's root is not a SHA-256 hash")
        return cls(origin, int(size), digest)


def sign(cp: Checkpoint, signer: note.Signer) -> str:
    return note.sign(cp.text(), signer)


def open_signed(signed: str, verifiers: list[note.Verifier], origin: str | None = None) -> Checkpoint:
    """The checkpoint of a signed note a known key signed (NoteError otherwise); with `origin`, of that log."""
    text, _ = note.open_note(signed, verifiers)
    cp = Checkpoint.parse(text)
    if origin is not None and cp.origin != origin:
        raise note.NoteError(f"the checkpoint is of log {cp.origin!r}, not {origin!r}")
    return cp


def proof_text(index: int, proof: list[bytes], signed_checkpoint: str) -> str:
    lines = [PROOF_HEADER, f"index {index}"] + [base64.b64encode(p).decode() for p in proof]
    return "\n".join(lines) + "\n\n" + signed_checkpoint


@dataclass(frozen=True)
class TlogProof:
    index: int
    proof: list[bytes]
    signed_checkpoint: str
    extra: bytes | None = None

    @classmethod
    def parse(cls, text: str) -> "TlogProof":
        head, sep, signed = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or lines[0] != PROOF_HEADER:
            raise note.NoteError(f"not a {PROOF_HEADER} proof")
        extra = None
        rest = lines[1:]
        if rest and rest[0].startswith("extra "):
            extra = base64.b64decode(rest.pop(0)[6:])
        if not rest or not rest[0].startswith("index ") or not rest[0][6:].isdigit():
            raise note.NoteError("the proof has no index line")
        try:
            hashes = [base64.b64decode(x, validate=True) for x in rest[1:]]
        except binascii.Error:
            raise note.NoteError("a proof line that is not base64") from None
        return cls(int(rest[0][6:]), hashes, signed, extra)

    def verify(self, entry: bytes, verifiers: list[note.Verifier], origin: str | None = None) -> Checkpoint:
        """The checkpoint under which `entry` is at `index`, or NoteError/ProofError."""
        cp = open_signed(self.signed_checkpoint, verifiers, origin)
        merkle.verify_inclusion(self.index, cp.size, merkle.leaf_hash(entry), self.proof, cp.root)
        return cp


def parse_add_checkpoint(body: bytes) -> tuple[int, list[bytes], str]:
    """(old size, proof hashes, signed checkpoint) of an add-checkpoint body; ValueError when malformed."""
    if len(body) > MAX_REQUEST:
        raise ValueError(f"a request larger than {MAX_REQUEST} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the request is not UTF-8") from None
    head, sep, signed = text.partition("\n\n")
    lines = head.split("\n")
    m = _OLD.fullmatch(lines[0])
    if not sep or not m:
        raise ValueError("the request is `old <size>`, proof lines, an empty line, then the checkpoint")
    if len(lines) - 1 > MAX_PROOF:
        raise ValueError(f"more than {MAX_PROOF} proof lines")
    try:
        proof = [base64.b64decode(x, validate=True) for x in lines[1:]]
    except binascii.Error:
        raise ValueError("a proof line that is not base64") from None
    if any(len(h) != merkle.HASH_SIZE for h in proof):
        raise ValueError("a proof line that is not a SHA-256 hash")
    return int(m.group(1)), proof, signed


def add_checkpoint_body(old: int, proof: list[bytes], signed: str) -> bytes:
    """The add-checkpoint body of `signed` from `old` with its consistency proof."""
    lines = [f"old {old}"] + [base64.b64encode(h).decode() for h in proof]
    return ("\n".join(lines) + "\n\n" + signed).encode()
