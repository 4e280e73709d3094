"""C2SP tlog-cosignature v1 (c2sp.org/tlog-cosignature, Ed25519): a witness's timestamped signature on
a checkpoint, as one more signature line of the checkpoint's note. The signed message is
"cosignature/v1\\ntime <unix seconds>\\n" then the checkpoint's text; the line is
`— <name> base64(key id || 8-byte big-endian timestamp || 64-byte Ed25519 signature)`, the key id
SHA-256(name || "\\n" || 0x04 || public key)[:4]. Witness keys: verifier keys of type 0x04, and a key
file in the note key format with that type (`PRIVATE+KEY+name+hex(id)+base64(0x04||seed)`)."""

from __future__ import annotations

import base64
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from runledger.ledger.tlog import note
from runledger.ledger.tlog.note import COSIGNATURE_V1, DASH, NoteError

MAX_TIMESTAMP = (1 << 63) - 1  # the spec's bound on a timestamp


def key_id(name: str, public: bytes) -> int:
    """SHA-256(name || 0x0A || 0x04 || public key)[:4], big-endian."""
    return note.key_id(name, public, COSIGNATURE_V1)


def message(text: str, timestamp: int) -> bytes:
    """What a cosignature signs: the header line, the time line, the checkpoint's text."""
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


@dataclass(frozen=True)
class CosignVerifier:
    """A witness's verifier key (`name+hex(id)+base64(0x04||public key)`)."""

    name: str
    id: int
    public: bytes

    @classmethod
    def parse(cls, vkey: str) -> "CosignVerifier":
        return cls(*note.parse_vkey(vkey, COSIGNATURE_V1))

    def text(self) -> str:
        return note.vkey_text(self.name, self.public, COSIGNATURE_V1)

    def timestamp_of(self, text: str, sig: bytes) -> int | None:
        """The timestamp of a valid cosignature (`sig` after the key id) on `text`; None if it fails."""
        if len(sig) != 8 + 64:
            return None
        (ts,) = struct.unpack(">Q", sig[:8])
        if ts > MAX_TIMESTAMP:
            return None
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(sig[8:], message(text, ts))
        except InvalidSignature:
            return None
        return ts


@dataclass(frozen=True)
class Cosigner:
    """A witness's signing key."""

    name: str
    seed: bytes

    @classmethod
    def generate(cls, name: str) -> "Cosigner":
        return cls(name, note.new_seed(name))

    @classmethod
    def parse(cls, text: str) -> "Cosigner":
        return cls(*note.parse_private(text, COSIGNATURE_V1))

    @property
    def verifier(self) -> CosignVerifier:
        public = note.public_of(self.seed)
        return CosignVerifier(self.name, key_id(self.name, public), public)

    def text(self) -> str:
        return note.private_text(self.name, self.seed, COSIGNATURE_V1)

    def cosign(self, text: str, timestamp: int | None = None) -> str:
        """The cosignature line (ending in a newline) of the checkpoint text `text`, now or at `timestamp`."""
        ts = int(time.time()) if timestamp is None else timestamp
        sig = Ed25519PrivateKey.from_private_bytes(self.seed).sign(message(text, ts))
        raw = struct.pack(">IQ", self.verifier.id, ts) + sig
        return f"{DASH} {self.name} {base64.b64encode(raw).decode()}\n"


def cosigners(signed: str, witnesses: list[CosignVerifier]) -> dict[CosignVerifier, int]:
    """{witness key: timestamp} of the valid cosignatures on the note `signed` by `witnesses`. Lines by
    other keys are ignored (the signed-note rule); a known witness's line that does not verify raises
    NoteError."""
    text, sigs = note.signatures(signed)
    known = {(w.name, w.id): w for w in witnesses}
    out: dict[CosignVerifier, int] = {}
    for s in sigs:
        w = known.get((s.name, s.id))
        if w is None:
            continue
        ts = w.timestamp_of(text, s.sig)
        if ts is None:
            raise NoteError(f"the cosignature by witness {w.name} does not verify")
        out[w] = ts
    return out


def read_key(path: str | Path) -> Cosigner:
    """The witness key in `path` (written by note.write_key), refused if others may read it."""
    return Cosigner.parse(note.read_secret(path))
