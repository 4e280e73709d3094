"""An event's inclusion proof from a root's log: the C2SP tlog-proof of a stored event under its log's
latest checkpoint (`runledger tlog prove`, the dashboard's /api/tlog/proof/EVENT_ID)."""

from __future__ import annotations

from pathlib import Path

from runledger.ledger.tlog import checkpoint, log, merkle, tiles


class NotProved(LookupError):
    """No proof to give: no such event, no log, or not under a signed checkpoint yet; one line."""


def logs_of(root: Path) -> list:
    """The root's logs: `tlog/`, or each partition's `tlog/p{N}/` (folders, or on object storage beside
    the tables: see log.log_dir)."""
    base = log.log_dir(Path(root))
    if (base / tiles.CHECKPOINT).exists():
        return [base]
    if isinstance(base, Path):
        parts = [p for p in base.glob("p*") if (p / tiles.CHECKPOINT).exists()]
    else:  # (an object store has no folders: the partitions' checkpoints are listed)
        parts = [f.parent for f in base.files(suffix="/" + tiles.CHECKPOINT) if f.parent.parent == base]
    return sorted(parts, key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1)


def text_of(signed: str) -> str:
    """A signed checkpoint's text (our own log's: its signature is the auditor's to check)."""
    return signed[:signed.rfind("\n\n") + 1]


def prove(root: str | Path, event_id: str) -> str:
    import pyarrow.compute as pc

    from runledger.ledger.storage.reads import read_events

    t = read_events(Path(root), columns=["event_id", "run_id", "producer", "attempt", "seq", "hash"])
    t = t.filter(pc.equal(t.column("event_id"), event_id))
    if t.num_rows == 0:
        raise NotProved(f"no stored event {event_id} in {root}")
    entry = log.entry_of(t.to_pylist()[0])
    logs = logs_of(Path(root))
    if not logs:
        raise NotProved(f"{root}: no transparency log (tlog/checkpoint); a ledger writes one as it stores events")
    for d in logs:
        reader = tiles.Tiles(d)
        signed = reader.checkpoint()
        cp = checkpoint.Checkpoint.parse(text_of(signed))
        for i, e in enumerate(reader.entries(cp.size)):
            if e == entry:
                proof = merkle.inclusion_proof(reader.node(cp.size), i, cp.size)
                merkle.verify_inclusion(i, cp.size, merkle.leaf_hash(entry), proof, cp.root)
                return checkpoint.proof_text(i, proof, signed)
    raise NotProved(f"event {event_id} is stored but in no signed checkpoint yet (signed within seconds; try again)")
