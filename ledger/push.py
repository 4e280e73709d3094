"""`runledger push ROOT --to NATS_URL`: a root's chains (stored, and still spooled) moved onto another
ledger verbatim, so that the same envelopes and hashes are stored there and `verify` holds on both sides.

A run logged offline (a laptop, a cluster with no route to the central server) keeps its events in
its root; push publishes them to the central server's stream as their producers would have: each
event's canonical text, rebuilt from the stored columns (its hash recomputed and checked against the
stored one before it goes: a changed row is never sent) or taken from the spool line as it is, with
Nats-Msg-Id = event_id:hash, in seq order per chain (runledger.ledger.emit.publish's window of acks).
The receiving ledger deduplicates by that id and by event_id and hash, so a push cut off and run again
sends, per chain, only what the receiver has not stored (its chain status: `stored_upto`), and nothing
is stored twice.

A chain the receiver holds differently (another event under a stored event_id: two roots that used
the same run and producer) is refused and named: before the rest of a chain goes, its last event the
receiver holds is sent alone and must come back a duplicate; one that comes back a conflict (the
receiver's chain status names it) stops that chain, and push exits 1 naming every chain refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from runledger.ledger import settings
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.canonical import envelope_text, event_hash
from runledger.ledger.contract.events import RELAY, relay_subject_for

log = logging.getLogger(__name__)

WINDOW = 512  # publishes in flight before their acks are awaited
STORED_WAIT_S = 120.0  # how long push waits for the receiver to store what it sent
Chain = tuple[str, str, int]  # (run_id, producer, attempt)


@dataclass
class Outgoing:
    """One event as it goes: its subject, its bytes, its Nats-Msg-Id."""

    seq: int
    subject: str
    data: bytes
    msg_id: str
    hash: str


@dataclass
class Pushed:
    """What a push did: events sent, chains complete on the receiver, and chains refused (with why)."""

    sent: int = 0
    chains: int = 0
    refused: dict[Chain, str] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # local rows or spool lines that cannot go verbatim


def relay_of(nats_url: str) -> str:
    """The relay's name on the receiving server: the user its URL names (a secure server's `relay`), else `relay`."""
    from urllib.parse import urlsplit

    first = nats_url.split(",")[0].strip()
    return urlsplit(first if "://" in first else f"nats://{first}").username or RELAY


def chains_of(root: Path, out: Pushed, relay: str = RELAY) -> dict[Chain, dict[int, Outgoing]]:
    """The root's chains, stored and spooled: per chain, seq -> the event as it goes (on `relay`'s
    subjects, saying it comes from this root: its id, runledger.ledger.storage.positions.root_id)."""
    from runledger.ledger.storage.positions import root_id

    source = root_id(root)

    def subject_for(run_id: str, kind: str) -> str:
        return relay_subject_for(run_id, kind, relay, source)

    from runledger.ledger.storage import paths, reads
    from runledger.ledger.storage.rows import ENVELOPE_SCHEMA

    chains: dict[Chain, dict[int, Outgoing]] = {}
    if paths.is_tables(root):
        t = reads.read_events(root, columns=[n for n, _ in ENVELOPE_SCHEMA if n not in ("ts", "ingested_at", "stream_seq")])
        for env in t.to_pylist():
            text = env.pop("payload")
            if event_hash(env, text) != env["hash"]:
                out.unreadable.append(f"stored event {env['event_id']}: its hash does not match its columns (not sent)")
                continue
            data = envelope_text(env, text, with_hash=True).encode()
            chains.setdefault((env["run_id"], env["producer"], env["attempt"]), {})[env["seq"]] = Outgoing(
                env["seq"], subject_for(env["run_id"], env["kind"]), data, bus.msg_id(env["event_id"], env["hash"]),
                env["hash"])
    for seg in sorted(settings.spool_dir(root).glob("*/*/*/seg-*.jsonl")):
        for line in seg.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                env = orjson.loads(line)
                key, seq = (env["run_id"], env["producer"], int(env["attempt"])), int(env["seq"])
                item = Outgoing(seq, subject_for(env["run_id"], env["kind"]), line, bus.msg_id(env["event_id"], env["hash"]),
                                env["hash"])
            except (ValueError, KeyError, TypeError) as err:
                out.unreadable.append(f"spool line in {seg}: {err}")
                continue
            have = chains.setdefault(key, {}).get(seq)
            if have is None:
                chains[key][seq] = item
            elif have.hash != item.hash:
                out.refused[key] = f"its spool holds another event at seq {seq} than its tables"
    return chains


def shown(chain: Chain) -> str:
    return f"{chain[0]}:{chain[1]}:{chain[2]}"


async def _status(nc, chain: Chain) -> tuple[int, int, set[int]] | None:
    """(ack floor, stored_upto, conflicting seqs) of `chain` on the receiver; None if no ledger answers."""
    from runledger.ledger.emit.chains import ask_ledger

    got = await ask_ledger(nc, chain[0], chain[1])
    if got is None:
        return None
    mine = got["chains"].get(str(chain[2]), {})
    return got["ack_floor"], int(mine.get("stored_upto", 0)), set(mine.get("conflicts", []))


class Refused(RuntimeError):
    """The receiving server refused this credential (a permissions violation): not a relay's."""


def _check(refusals: list[str]) -> None:
    if refusals:
        raise Refused(f"the receiving server refused to take the events from this credential: {refusals[0]} "
                      f"(on a secure server, push with the `relay` role's credentials)")


async def _status_when(nc, chain: Chain, done, wait_s: float = STORED_WAIT_S,
                       refusals: list[str] | None = None) -> tuple[int, int, set[int]]:
    """The chain's status once `done(status)`, waiting up to `wait_s` (then the last status)."""
    deadline = time.monotonic() + wait_s
    while True:
        _check(refusals or [])
        status = await _status(nc, chain)
        if status is not None and (done(status) or time.monotonic() > deadline):
            return status
        if status is None and time.monotonic() > deadline:
            raise RuntimeError(f"no ledger answers for chain {shown(chain)}: is a ledger serving the receiving server?")
        await asyncio.sleep(0.2)


async def _publish(js, items: list[Outgoing], refusals: list[str] | None = None) -> int:
    """Publish `items` in order with a window of acks in flight; the highest stream seq acked. Raises
    Refused as soon as the server says the credential may not publish them."""
    last = 0
    for start in range(0, len(items), WINDOW):
        chunk = items[start:start + WINDOW]
        futs = [await js.publish_async(i.subject, i.data, headers={"Nats-Msg-Id": i.msg_id}) for i in chunk]
        acks = asyncio.ensure_future(asyncio.gather(*futs))
        deadline = time.monotonic() + 60
        while not acks.done():
            await asyncio.wait({acks}, timeout=0.2)
            if refusals and not acks.done():
                acks.cancel()
                _check(refusals)
            if time.monotonic() > deadline and not acks.done():
                acks.cancel()
                raise TimeoutError(f"the receiving server did not acknowledge {len(chunk)} events in 60s")
        for ack in acks.result():
            last = max(last, ack.seq)
    return last


async def push(root: str | Path, nats_url: str, wait_s: float = STORED_WAIT_S) -> Pushed:
    """Push every chain of `root` to the ledger behind `nats_url` (see the module docstring)."""
    out = Pushed()
    chains = chains_of(Path(root), out, relay_of(nats_url))
    refusals: list[str] = []

    async def said(err: Exception) -> None:
        if "permissions violation" in str(err).lower():
            refusals.append(" ".join(str(err).split()))

    nc = await bus.connect(nats_url, name="runledger-push", error_cb=said, max_reconnect_attempts=3)
    try:
        js = nc.jetstream()
        await bus.ensure_stream(js)
        for chain in sorted(chains):
            if chain in out.refused:
                continue
            events = [chains[chain][s] for s in sorted(chains[chain])]
            _, upto, conflicts = await _status_when(nc, chain, lambda s: True, wait_s, refusals)
            if conflicts:
                out.refused[chain] = f"the receiver holds other events at seqs {sorted(conflicts)[:5]}"
                continue
            if upto > 0:  # the last event both hold, alone: the same (so every one before it), or another's chain
                probe = [e for e in events if e.seq == min(upto - 1, events[-1].seq)]
                if probe:
                    at = await _publish(js, probe, refusals)
                    _, upto, conflicts = await _status_when(nc, chain, lambda s: s[0] >= at or bool(s[2]), wait_s, refusals)
                    if conflicts:
                        out.refused[chain] = f"the receiver holds another event at seq {probe[0].seq}"
                        continue
            todo = [e for e in events if e.seq >= upto]
            if todo:
                await _publish(js, todo, refusals)
                out.sent += len(todo)
        for chain in sorted(set(chains) - set(out.refused)):  # stored there, or refused there
            last = max(chains[chain]) + 1
            _, upto, conflicts = await _status_when(nc, chain, lambda s: s[1] >= last or bool(s[2]), wait_s, refusals)
            if conflicts:
                out.refused[chain] = f"the receiver holds other events at seqs {sorted(conflicts)[:5]}"
            elif upto < last:
                raise RuntimeError(f"chain {shown(chain)}: the receiver stored it up to seq {upto}, not {last} "
                                   f"within {wait_s:.0f}s; run push again to go on")
            else:
                out.chains += 1
    finally:
        await nc.close()
    return out
