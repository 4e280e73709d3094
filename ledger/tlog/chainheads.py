"""Signed chain heads: a producer's signature over its chain so far, as an event of kind `chain_head`
(the contract's `ChainHeadSigned`), and the check of a chain's heads.

A head is a C2SP signed note whose first line is its own, so that no head reads as a checkpoint:

    runledger/chain-head/v1
    {run_id}
    {producer}
    {attempt}
    {upto_seq}
    {base64 of the hash of the event at upto_seq}

signed by a key the producer makes for its attempt (kept in memory only). The chain is hash-linked, so a
head vouches for every event from seq 0 to upto_seq. The first head an attempt's key signs carries the
key (its verifier key) and the user's key's signed note over it (`runledger/chain-key/v1`, the run,
producer, attempt and the attempt key): the user's key is a file outside the data root, 0600, made on
first use and said where ($RUNLEDGER_PRODUCER_KEY, else $XDG_CONFIG_HOME/runledger/producer.key), never
the log's key, which signs checkpoints, not chains.

A head is the event just after the one it covers (upto_seq = its seq - 1, head = its prev_hash): the
Emitter signs one every EVERY events or INTERVAL_S seconds, on its publisher's thread, and at close.
What the check proves: each head is signed by an attempt key that a user key vouched for, one user key
per chain; every event up to a good head is the one signed; a finished chain has no event after its
last head. Which user keys to trust is the auditor's to say (`--producer-keys`); without that list, the
keys are named.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path

HEAD_V1 = "runledger/chain-head/v1"
VOUCH_V1 = "runledger/chain-key/v1"
KIND = "chain_head"
KEY_ENV = "RUNLEDGER_PRODUCER_KEY"
HEADS_ENV = "RUNLEDGER_HEADS"  # "off": workers' Emitters sign no heads (on by default: see enabled)
EVERY_ENV, EVERY = "RUNLEDGER_HEAD_EVERY", 1000  # a head at least every this many events...
INTERVAL_ENV, INTERVAL_S = "RUNLEDGER_HEAD_S", 30.0  # ...or this many seconds (the heartbeat's interval)


def enabled() -> bool:
    """Whether workers sign heads: yes unless $RUNLEDGER_HEADS is off (0, no, false), as the bench's baseline
    sets it. A head is an event of the worker's chain like any other: `events` and the log count it."""
    return os.environ.get(HEADS_ENV, "on").lower() not in ("off", "0", "no", "false")


def every() -> tuple[int, float]:
    """(events, seconds) between heads: $RUNLEDGER_HEAD_EVERY and $RUNLEDGER_HEAD_S where they are numbers > 0."""
    try:
        n = int(os.environ.get(EVERY_ENV) or EVERY)
    except ValueError:
        n = EVERY
    try:
        t = float(os.environ.get(INTERVAL_ENV) or INTERVAL_S)
    except ValueError:
        t = INTERVAL_S
    return (n if n > 0 else EVERY), (t if 0 < t < float("inf") else INTERVAL_S)


def user_key_file() -> Path:
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "runledger" / "producer.key"


def head_text(run_id: str, producer: str, attempt: int, upto_seq: int, head: str) -> str:
    return f"{HEAD_V1}\n{run_id}\n{producer}\n{attempt}\n{upto_seq}\n{base64.b64encode(bytes.fromhex(head)).decode()}\n"


def vouch_text(run_id: str, producer: str, attempt: int, attempt_key: str) -> str:
    return f"{VOUCH_V1}\n{run_id}\n{producer}\n{attempt}\n{attempt_key}\n"


class HeadSigner:
    """One attempt's signer: a fresh Ed25519 key, vouched for by the user's key (`user`, else the key file's)."""

    def __init__(self, run_id: str, producer: str, attempt: int, user=None) -> None:
        from runledger.ledger.tlog import note

        self.run_id, self.producer, self.attempt = run_id, producer, attempt
        self.user = user or note.load_or_make_key(user_key_file(), what="the user's key that vouches for producers' chain heads")
        self.key = note.Signer.generate(f"{run_id}/{producer}/{attempt}")
        self.attempt_key = self.key.verifier.text()
        self.vouch = note.sign(vouch_text(run_id, producer, attempt, self.attempt_key), self.user)

    def payload(self, upto_seq: int, head: str, first: bool) -> dict:
        """The `chain_head` payload over the chain up to `upto_seq` (whose hash is `head`); `first`: with
        the attempt key and its vouch."""
        from runledger.ledger.tlog import note

        out = {"upto_seq": upto_seq, "head": head,
               "note": note.sign(head_text(self.run_id, self.producer, self.attempt, upto_seq, head), self.key)}
        if first:
            out.update(attempt_key=self.attempt_key, user_key=self.user.verifier.text(), vouch=self.vouch)
        return out


@dataclass(frozen=True)
class Head:
    """One stored `chain_head` event: its seq and prev_hash (the envelope's) and its payload."""

    seq: int
    prev_hash: str
    payload: dict


@dataclass
class ChainChecked:
    user_key: str | None = None  # the verifier key that vouched for the chain's attempt keys
    heads: int = 0  # heads that checked
    covered: int = -1  # the seq of the last head that checked (every event up to it is signed)
    problems: list[str] = field(default_factory=list)


def check_chain(run_id: str, producer: str, attempt: int, heads: list[Head], last_seq: int,
                finished_seq: int | None, trusted: set[str] | None = None) -> ChainChecked:
    """Check one chain's heads (in any order): each head's vouch and signature, that it signs the stored
    event just before it, one user key (one of `trusted`, if given); and, if the chain holds a
    `run_finished` (at `finished_seq`), that no event follows its last good head. Each problem names
    the event."""
    from runledger.ledger.tlog import note

    out = ChainChecked()
    chain = f"{run_id}:{producer}:{attempt}"
    key: note.Verifier | None = None
    signed_from = 0  # the first seq the next head vouches for that no head before it did
    for h in sorted(heads, key=lambda h: h.seq):
        eid, p = f"{chain}:{h.seq}", h.payload
        if p.get("attempt_key") is not None:
            try:
                user = note.Verifier.parse(p.get("user_key") or "")
                new = note.Verifier.parse(p["attempt_key"])
                text, _ = note.open_note(p.get("vouch") or "", [user])
                if text != vouch_text(run_id, producer, attempt, p["attempt_key"]):
                    raise note.NoteError("its text is not this chain's vouch for that key")
            except note.NoteError as err:
                out.problems.append(f"{eid}: a chain head whose attempt key {str(p['attempt_key'])[:60]} the user key "
                                    f"{str(p.get('user_key'))[:60]} did not vouch for ({err})")
                key = None
                continue
            if out.user_key is None:
                out.user_key = user.text()
            elif user.text() != out.user_key:
                out.problems.append(f"{eid}: a chain head vouched for by the user key {user.text()}, not by the chain's "
                                    f"({out.user_key}, its first head's)")
                key = None
                continue
            if trusted is not None and user.text() not in trusted:
                out.problems.append(f"{eid}: a chain head vouched for by the user key {user.text()}, which is not "
                                    "among the trusted producer keys")
                key = None
                continue
            key = new
        elif key is None:
            out.problems.append(f"{eid}: a chain head signed by a key no user key vouched for (no vouched attempt key "
                                "before it in the chain)")
            continue
        try:
            text, _ = note.open_note(p.get("note", ""), [key])
        except note.NoteError as err:
            out.problems.append(f"{eid}: a chain head not signed by the chain's vouched attempt key {key.name} ({err})")
            continue
        if text != head_text(run_id, producer, attempt, p["upto_seq"], p["head"]) or p["upto_seq"] != h.seq - 1:
            out.problems.append(f"{eid}: a chain head whose signed note is not over seq {h.seq - 1} and the hash it names")
            continue
        if p["head"] != h.prev_hash:
            out.problems.append(f"{chain}:{p['upto_seq']}: not the event the chain head {eid} signed (its hash is "
                                f"{h.prev_hash[:16]}…, the head signed {p['head'][:16]}…): an event in seqs "
                                f"{signed_from}..{p['upto_seq']} was written after it was signed")
            continue
        out.heads += 1
        out.covered = h.seq
        signed_from = h.seq + 1
    if finished_seq is not None and out.covered < last_seq:
        out.problems.append(f"{chain}:{out.covered + 1}: after the last signed chain head of a finished chain "
                            f"(run_finished at seq {finished_seq}): seqs {out.covered + 1}..{last_seq} are not covered")
    return out
