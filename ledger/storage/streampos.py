"""Where the tables stand on the stream, kept in the Iceberg commit itself: each ledger commit's
snapshot summary carries, per writer (the single ledger, or partition k{K}-p{p}), the highest stream
seq that commit holds (`runledger.stream-seq.{writer}`), and the identity of the stream it was fed by
(`runledger.stream`: the stream's name and creation time, `RUNLEDGER@2026-12-07T05:00:00.123456+00:00`).

So a restarting writer reads its place from the tables' current snapshots (one per table: O(kinds),
not O(events)) and skips what is redelivered at or below it before any dedupe lookup, and a stream
made anew (deleted, its server's folder lost) is told from the one the tables were fed by: the seqs of
a new stream are not the old one's, and taking it on would skip its events or store them twice.

Only the last table of a commit gets the new position (a crash between tables leaves the position
where it was: the events of the tables not committed come again); every other snapshot, compaction's
and removal's included, carries the positions of its parent forward (`carried`), so the current
snapshot of any table holds every writer's last position it saw, and the position is the highest over
the tables' current snapshots of those fed by the same stream.

A new stream is adopted only by a person (`runledger ledger adopt-stream`, once the root's spools are
replayed into it) or, on the embedded default, by the supervisor whose own server folder was lost:
`{root}/stream.adopted` names it, and until the tables' commits carry it, their old position is not
the new stream's (the ledger starts from the new stream's first message; what it stored already is a
duplicate by event_id and hash, stored once).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from runledger.ledger.storage import leaves
from runledger.ledger.storage.paths import COMMIT_KEY, POSITION_FILE

STREAM_KEY = "runledger.stream"
SEQ_PREFIX = "runledger.stream-seq."
ADOPTED_FILE = "stream.adopted"  # in the root: the stream adopted in place of the one the tables were fed by
SINGLE = "ledger"  # the single ledger's writer key


def identity(name: str, created: datetime | None) -> str:
    """A stream's identity: its name and creation time (a stream deleted and made anew has another)."""
    when = created.astimezone(timezone.utc).isoformat() if created is not None else "unknown"
    return f"{name}@{when}"


async def stream_identity(js, name: str) -> str:
    return identity(name, (await js.stream_info(name)).created)


def writer_key(position) -> str:
    """The summary key's writer part for a writer's Position (runledger.ledger.ingest.position)."""
    if getattr(position, "partitioned", False):
        return f"k{position.k}-p{position.p}"
    return SINGLE


def commit_props(writer: str, seq: int, stream: str | None) -> dict[str, str]:
    """The summary properties a commit holding messages up to `seq` of `stream` adds."""
    props = {SEQ_PREFIX + writer: str(seq)}
    if stream:
        props[STREAM_KEY] = stream
    return props


def carried(summary: dict | None, props: dict[str, str] | None = None) -> dict[str, str]:
    """The position properties of a child snapshot: its parent's (`summary`), carried forward, updated
    by its own commit's `props` (and the parent's place on the transparency log: leaves.carried). A commit fed by another stream than its parent's drops the parent's
    seqs: they are the old stream's, not the new one's."""
    props = props or {}
    parent = {k: v for k, v in (summary or {}).items() if k == STREAM_KEY or k.startswith(SEQ_PREFIX)}
    if props.get(STREAM_KEY) and parent.get(STREAM_KEY) not in (None, props[STREAM_KEY]):
        parent = {}
    return {**leaves.carried(summary or {}), **parent, **props}  # (the log's place is not the stream's)


@dataclass
class CommitPosition:
    """The tables' place on the stream: the stream they were last fed by and, per writer, the highest
    seq of that stream their commits hold."""

    stream: str | None = None
    seqs: dict[str, int] = field(default_factory=dict)

    def seq(self, writer: str) -> int:
        return self.seqs.get(writer, 0)


def of_summaries(summaries: list[dict]) -> CommitPosition:
    """The position from the current snapshots' summaries: the stream of the latest commit that names
    one, and the highest seq per writer over the snapshots fed by that stream."""
    named = [s for s in summaries if s.get(STREAM_KEY)]
    if not named:
        return CommitPosition()
    stream = max(named, key=lambda s: int(s.get(COMMIT_KEY, 0)))[STREAM_KEY]
    out = CommitPosition(stream)
    for s in named:
        if s[STREAM_KEY] != stream:
            continue
        for k, v in s.items():
            if k.startswith(SEQ_PREFIX):
                writer = k.removeprefix(SEQ_PREFIX)
                out.seqs[writer] = max(out.seqs.get(writer, 0), int(v))
    return out


def read(tables) -> CommitPosition:
    """The tables' position (runledger.ledger.storage.tables.Tables): one current snapshot per table."""
    summaries = []
    for name in tables.names():
        t = tables.table(name)
        t.refresh()
        snap = t.current_snapshot()
        if snap is not None:
            summaries.append(dict(snap.summary.additional_properties))
    return of_summaries(summaries)


# ---- adoption of a new stream


def adopted(root: Path) -> str | None:
    """The stream identity adopted for `root` in place of its tables' (see adopt), or None."""
    try:
        return json.loads((Path(root) / ADOPTED_FILE).read_text())["stream"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def expected(root: Path, position: CommitPosition) -> tuple[str | None, bool]:
    """(the stream identity the root's ledger may take messages from, whether the tables' position is
    that stream's). None: any (the tables name none yet: a new root, or one of before this record)."""
    new = adopted(root)
    if new is not None and new != position.stream:
        return new, False
    return position.stream, True


def adopt(root: Path, stream: str, was: str | None, reason: str) -> None:
    """Record that `root`'s ledger takes `stream` from its first message on, in place of `was`; its
    single ledger's position file (the old stream's seqs) goes back to 0."""
    root = Path(root)
    doc = {"stream": stream, "was": was, "reason": reason,
           "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    tmp = root / f".{ADOPTED_FILE}.tmp"
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, root / ADOPTED_FILE)
    for position in [root / POSITION_FILE, *root.glob("partitions/k*-p*.position")]:
        if position.exists():
            ptmp = position.with_name(f".{position.name}.tmp")
            ptmp.write_text("0")
            os.replace(ptmp, position)


def refusal(root: Path, stream: str, was: str) -> str:
    """The one line a ledger refuses a stream not the tables' with."""
    return (f"stream {stream} is not the one root {root} was fed by ({was}): its seqs are not the root's, so taking "
            f"it would skip events or store them twice; once the root's spools are replayed into it, adopt it with "
            f"`runledger ledger adopt-stream --root {root} --nats URL`")
