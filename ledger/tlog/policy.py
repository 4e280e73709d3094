"""A C2SP tlog-policy file (c2sp.org/tlog-policy): the logs (`log <vkey> [url]`), the witnesses
(`witness <name> <vkey> [url]`), groups (`group <name> <k|all|any> <member>...`) and the one quorum
(`quorum <name>`, or `none`). The ledger asks the witnesses that have a URL for cosignatures
(runledger.ledger.tlog.witnessing); the audit requires the quorum on the checkpoint it audits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runledger.ledger.tlog import note
from runledger.ledger.tlog.cosignature import CosignVerifier

POLICY_ENV = "RUNLEDGER_TLOG_POLICY"  # the ledger's policy file: the witnesses it asks
NONE = "none"  # the predefined quorum that needs no cosignature


class PolicyError(ValueError):
    """A policy file that does not parse; one line, with its line number."""


@dataclass(frozen=True)
class Witness:
    name: str
    key: CosignVerifier
    url: str | None = None


@dataclass(frozen=True)
class Group:
    name: str
    k: int
    members: tuple[str, ...]


@dataclass
class Policy:
    logs: list[tuple[note.Verifier, str | None]] = field(default_factory=list)
    witnesses: dict[str, Witness] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    quorum: str = NONE

    def log_keys(self) -> list[note.Verifier]:
        return [v for v, _ in self.logs]

    def witness_keys(self) -> list[CosignVerifier]:
        return [w.key for w in self.witnesses.values()]

    def satisfied(self, cosigned: set[str], name: str | None = None) -> bool:
        """Whether the witnesses `cosigned` (policy names) witness the quorum (or group/witness `name`)."""
        name = self.quorum if name is None else name
        if name == NONE:
            return True
        if name in self.witnesses:
            return name in cosigned
        g = self.groups[name]
        return sum(self.satisfied(cosigned, m) for m in g.members) >= g.k

    def missing(self, cosigned: set[str], name: str | None = None) -> list[str]:
        """The witnesses under the quorum (or `name`) with no cosignature, in the policy's order."""
        name = self.quorum if name is None else name
        if name == NONE:
            return []
        if name in self.witnesses:
            return [] if name in cosigned else [name]
        out: list[str] = []
        for m in self.groups[name].members:
            out += [w for w in self.missing(cosigned, m) if w not in out]
        return out


def parse(text: str) -> Policy:
    p = Policy()
    quorum = None
    seen_keys: set[bytes] = set()
    for n, raw in enumerate(text.split("\n"), 1):
        if any(c < " " and c != "\t" for c in raw.rstrip("\r")):
            raise PolicyError(f"line {n}: a control character")
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            quorum = _line(p, words, seen_keys, quorum)
        except (PolicyError, note.NoteError) as err:
            raise PolicyError(f"line {n}: {err}") from None
    if quorum is None:
        raise PolicyError("no quorum line (`quorum none` asks for no cosignature)")
    p.quorum = quorum
    return p


def _line(p: Policy, words: list[str], seen_keys: set[bytes], quorum: str | None) -> str | None:
    kind, args = words[0], words[1:]
    if kind == "log" and len(args) in (1, 2):
        v = note.Verifier.parse(args[0])
        _unique_key(v.public, seen_keys)
        p.logs.append((v, args[1] if len(args) > 1 else None))
    elif kind == "witness" and len(args) in (2, 3):
        _new_name(p, args[0])
        key = CosignVerifier.parse(args[1])
        _unique_key(key.public, seen_keys)
        p.witnesses[args[0]] = Witness(args[0], key, args[2] if len(args) > 2 else None)
    elif kind == "group" and len(args) >= 3:
        _new_name(p, args[0])
        members = tuple(args[2:])
        for m in members:
            if m not in p.witnesses and m not in p.groups:
                raise PolicyError(f"group {args[0]}: {m!r} is not a witness or group defined above")
        if len(set(members)) != len(members):
            raise PolicyError(f"group {args[0]}: a member listed twice")
        k = {"all": len(members), "any": 1}.get(args[1])
        if k is None:
            if not args[1].isdigit() or not 1 <= int(args[1]) <= len(members):
                raise PolicyError(f"group {args[0]}: the threshold is all, any or 1..{len(members)}, not {args[1]!r}")
            k = int(args[1])
        p.groups[args[0]] = Group(args[0], k, members)
    elif kind == "quorum" and len(args) == 1:
        if quorum is not None:
            raise PolicyError("a second quorum line")
        if args[0] != NONE and args[0] not in p.witnesses and args[0] not in p.groups:
            raise PolicyError(f"quorum {args[0]!r} is not a witness or group defined above")
        return args[0]
    else:
        raise PolicyError(f"not a policy line: {' '.join(words)[:80]!r}")
    return quorum


def _new_name(p: Policy, name: str) -> None:
    if name == NONE or name in p.witnesses or name in p.groups:
        raise PolicyError(f"the name {name!r} is taken")


def _unique_key(public: bytes, seen: set[bytes]) -> None:
    if public in seen:
        raise PolicyError("a public key listed twice")
    seen.add(public)


def load(path: str | Path) -> Policy:
    """The policy in `path` (PolicyError with the file's name and the line)."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise PolicyError(f"{path}: {err.strerror}") from None
    try:
        return parse(text)
    except PolicyError as err:
        raise PolicyError(f"{path}: {err}") from None
