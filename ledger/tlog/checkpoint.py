"""C2SP checkpoints (c2sp.org/tlog-checkpoint: origin, tree size, base64 root hash, as a signed note)
and C2SP tlog-proof texts (c2sp.org/tlog-proof@v1: index, inclusion proof, the checkpoint)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from runledger.ledger.tlog import merkle, note

PROOF_HEADER = "c2sp.org/tlog-proof@v1"


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
