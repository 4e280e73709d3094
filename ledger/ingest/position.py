"""A writer's position: what part of the stream a `Ledger` writes, and where it records how far it got.

The ledger service (runledger.ledger.ingest.service) is one writer, given its `Position`: the single
ledger of a root (`LedgerPosition`: RUNLEDGER through the durable consumer `ledger`, its position in
`{root}/ledger.position`), or one partition of a partitioned root (`Part`, in
runledger.ledger.ingest.partitions: the derived stream through `ledger-p{p}`, its position per
partition). The loop is the same for both; only what is named here differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from runledger.ledger.bus.consumers import stream_seq
from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX
from runledger.ledger.storage.positions import read_position, write_position
from runledger.ledger.storage.recovery import recover

DURABLE = "ledger"  # the single ledger's durable consumer


class Position(Protocol):
    """What a writer reads and where its position lives."""

    name: str  # for status lines and logs ("ledger", "partition 3")
    stream: str  # the stream its consumer is on
    durable: str  # its durable consumer
    filter: str  # the subjects that consumer takes
    partitioned: bool  # one part of a root: its position is not the stream's end, and other writers commit too

    def load(self, root: Path) -> int:
        """The last RUNLEDGER seq taken (stored, quarantined or recorded acking)."""

    def save(self, root: Path, stream_seq: int) -> None:
        """Record that messages up to `stream_seq` are taken (after the commit, before the ack)."""

    def recover(self, root: Path) -> dict[str, int]:
        """Remove what a dead predecessor left half written (its own files only)."""

    def unpack(self, msgs: list) -> list[tuple[str, bytes, int]]:
        """(RUNLEDGER subject, data, RUNLEDGER stream seq) of each message fetched."""


class LedgerPosition:
    """The single ledger of a root: every event of RUNLEDGER, through `durable`, position `ledger.position`."""

    name = "ledger"
    stream = STREAM
    filter = f"{SUBJECT_PREFIX}.>"
    partitioned = False

    def __init__(self, durable: str = DURABLE) -> None:
        self.durable = durable

    def load(self, root: Path) -> int:  # (the tables' commit holds the durable position: Ledger reads both)
        return read_position(Path(root))

    def save(self, root: Path, stream_seq: int) -> None:
        write_position(Path(root), stream_seq)

    def recover(self, root: Path) -> dict[str, int]:
        return recover(Path(root))

    def unpack(self, msgs: list) -> list[tuple[str, bytes, int]]:
        return [(m.subject, m.data, stream_seq(m)) for m in msgs]
