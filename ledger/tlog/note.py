"""C2SP signed notes (c2sp.org/signed-note) with Ed25519 keys: signing a text, verifying a note
against verifier keys (`vkey`s, `name+hex(id)+base64(0x01||public key)`), and the key file, which
holds the private key as Go's golang.org/x/mod/sumdb/note writes it
(`PRIVATE+KEY+name+hex(id)+base64(0x01||seed)`), so either tool reads the other's."""

from __future__ import annotations

import base64
import getpass
import hashlib
import logging
import os
import re
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

log = logging.getLogger(__name__)

ED25519 = 0x01  # the signature type of signed-note's Ed25519 keys
COSIGNATURE_V1 = 0x04  # the signature type of tlog-cosignature's Ed25519 keys (a witness's)
KINDS = {ED25519: "an Ed25519 key", COSIGNATURE_V1: "a witness's key (Ed25519 cosignature/v1)"}  # the types read here
DASH = "\u2014"  # the em dash that opens a signature line
_NAME = re.compile(r"^[^\s+]+$")  # a key name: non-empty, no space, no plus


class NoteError(ValueError):
    """A note, key or signature that does not check; one line."""


def key_id(name: str, public: bytes, kind: int = ED25519) -> int:
    """SHA-256(name || 0x0A || type || public key)[:4], big-endian: signed-note's key id for its Ed25519
    keys (type 0x01); tlog-cosignature's for a witness's (0x04)."""
    return struct.unpack(">I", hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()[:4])[0]


def _key_material(text: str, kind: int, what: str) -> bytes:
    """A key's base64(type||32 bytes), decoded and its type checked (`what`: the key, as an error names it)."""
    try:
        material = base64.b64decode(text, validate=True)
    except ValueError:
        raise NoteError(f"{what} is not base64") from None
    if len(material) != 33 or material[0] != kind:
        raise NoteError(f"{what} is not {KINDS[kind]} (type 0x{kind:02x}, 32 bytes)")
    return material


def parse_vkey(vkey: str, kind: int = ED25519) -> tuple[str, int, bytes]:
    """(name, id, public key) of a verifier key `name+hex(id)+base64(type||key)` of type `kind`, its id checked."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3 or not _NAME.match(parts[0]) or not re.fullmatch(r"[0-9a-f]{8}", parts[1]):
        raise NoteError(f"not a verifier key (name+hex id+base64 key): {vkey.strip()[:80]!r}")
    material = _key_material(parts[2], kind, f"{parts[0]}: the verifier key")
    if key_id(parts[0], material[1:], kind) != int(parts[1], 16):
        raise NoteError(f"the verifier key's id {parts[1]} is not the id of its name and key")
    return parts[0], int(parts[1], 16), material[1:]


def vkey_text(name: str, public: bytes, kind: int = ED25519) -> str:
    return f"{name}+{key_id(name, public, kind):08x}+{base64.b64encode(bytes([kind]) + public).decode()}"


def new_seed(name: str) -> bytes:
    """A new Ed25519 private key (its 32-byte seed) for a key named `name`."""
    if not _NAME.match(name):
        raise NoteError(f"a key name has no spaces or plus signs: {name!r}")
    return Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                      serialization.NoEncryption())


def public_of(seed: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def parse_private(text: str, kind: int = ED25519) -> tuple[str, bytes]:
    """(name, seed) of a key file's `PRIVATE+KEY+name+hex(id)+base64(type||seed)` of type `kind`, its id checked."""
    parts = text.strip().split("+", 4)
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"] or not _NAME.match(parts[2]):
        raise NoteError("not a signer key (PRIVATE+KEY+name+hex id+base64 key)")
    material = _key_material(parts[4], kind, "the signer key")
    if f"{key_id(parts[2], public_of(material[1:]), kind):08x}" != parts[3]:
        raise NoteError("the signer key's id is not the id of its name and key")
    return parts[2], material[1:]


def private_text(name: str, seed: bytes, kind: int = ED25519) -> str:
    pub = public_of(seed)
    return f"PRIVATE+KEY+{name}+{key_id(name, pub, kind):08x}+{base64.b64encode(bytes([kind]) + seed).decode()}"


@dataclass(frozen=True)
class Verifier:
    name: str
    id: int
    public: bytes

    @classmethod
    def parse(cls, vkey: str) -> "Verifier":
        return cls(*parse_vkey(vkey))

    def text(self) -> str:
        return vkey_text(self.name, self.public)

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, message)
            return True
        except InvalidSignature:
            return False


@dataclass(frozen=True)
class Signer:
    name: str
    seed: bytes

    @classmethod
    def generate(cls, name: str) -> "Signer":
        return cls(name, new_seed(name))

    @classmethod
    def parse(cls, text: str) -> "Signer":
        return cls(*parse_private(text))

    @property
    def public(self) -> bytes:
        return public_of(self.seed)

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, key_id(self.name, self.public), self.public)

    def text(self) -> str:
        return private_text(self.name, self.seed)

    def sign(self, message: bytes) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.seed).sign(message)


def sign(text: str, signer: Signer) -> str:
    """The signed note of `text` (which ends in a newline): text, a blank line, one signature line."""
    if not text.endswith("\n"):
        raise NoteError("a note's text ends in a newline")
    sig = struct.pack(">I", signer.verifier.id) + signer.sign(text.encode())
    return f"{text}\n{DASH} {signer.name} {base64.b64encode(sig).decode()}\n"


@dataclass(frozen=True)
class Signature:
    """One signature line of a note: the key's name and id, the signature after the id, the line."""

    name: str
    id: int
    sig: bytes
    line: str


def signatures(note: str) -> tuple[str, list[Signature]]:
    """The text of a signed note and its signature lines; NoteError for what is not a signed note."""
    if not note.endswith("\n"):
        raise NoteError("a signed note ends in a newline")
    if any(c < " " and c != "\n" for c in note):
        raise NoteError("a signed note holds a control character")
    cut = note.rfind("\n\n")
    if cut < 0:
        raise NoteError("no signature block (a blank line, then signature lines)")
    text, block = note[:cut + 1], note[cut + 2:]
    if not block:
        raise NoteError("a signed note without a signature")
    out = []
    for line in block.removesuffix("\n").split("\n"):
        m = re.fullmatch(DASH + r" (\S+) (\S+)", line)
        if not m:
            raise NoteError(f"not a signature line: {line[:80]!r}")
        try:
            sig = base64.b64decode(m.group(2), validate=True)
        except ValueError:
            raise NoteError(f"a signature by {m.group(1)} that is not base64") from None
        if len(sig) < 5:
            raise NoteError(f"a signature by {m.group(1)} too short to hold a key id")
        out.append(Signature(m.group(1), struct.unpack(">I", sig[:4])[0], sig[4:], line))
    return text, out


def open_note(note: str, verifiers: list[Verifier]) -> tuple[str, list[Verifier]]:
    """The text of `note` and the known verifiers whose signature on it checks. Unknown signatures
    are ignored (the spec's rule); a note no known key signed, or whose known key's signature fails,
    raises NoteError."""
    text, sigs = signatures(note)
    known = {(v.name, v.id): v for v in verifiers}
    good: list[Verifier] = []
    for s in sigs:
        v = known.get((s.name, s.id))
        if v is None:
            continue
        if not v.verify(text.encode(), s.sig):
            raise NoteError(f"the signature by {v.name} does not verify")
        good.append(v)
    if not good:
        raise NoteError("no signature by a known key (" + ", ".join(v.text() for v in verifiers) + ")")
    return text, good


def write_key(path: str | Path, signer) -> Path:
    """Write a signing key (a Signer, or a witness's Cosigner: its `text()`) to a new file only its owner
    reads (0600); refuses to overwrite one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(signer.text() + "\n")
    return path


def read_secret(path: str | Path) -> str:
    """The text of a key file, refused if others may read it (the 0600 rule of every secret)."""
    path = Path(path)
    mode = path.stat().st_mode & 0o077
    if mode and os.name == "posix":
        raise NoteError(f"{path} is readable by others (mode {path.stat().st_mode & 0o777:o}); chmod 600 it")
    return path.read_text()


def read_key(path: str | Path) -> Signer:
    """The signer key in `path` (read_secret's rule)."""
    return Signer.parse(read_secret(path))


def load_or_make_key(path: str | Path, name: str | None = None, what: str = "a signing key") -> Signer:
    """The signer key at `path`, made there (0600) on first use, saying where and `what` it is (the log's key:
    runledger.ledger.tlog.log; the user's key that vouches for chain heads: runledger.ledger.tlog.chainheads)."""
    path = Path(path)
    if path.exists():
        return read_key(path)
    user = "".join(c for c in getpass.getuser() if c.isalnum() or c in "-_.") or "user"
    signer = Signer.generate(name or f"runledger.local/{user}-{secrets.token_hex(4)}")
    try:
        write_key(path, signer)
    except FileExistsError:  # made meanwhile by another process
        return read_key(path)
    log.info("made %s %s (0600); its verifier key: %s", what, path, signer.verifier.text())
    return signer
