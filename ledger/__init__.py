"""The ledger: events from workers over NATS JetStream, stored exactly once, hash-chained, in Iceberg
tables of Parquet files. Its folders run as its layers do:

    contract/   what an event is: the envelope, every kind, canonical JSON and hashes, the checks
    storage/    what is stored and how it is read: a root's files, snapshots, tables, heads, locks
    bus/        NATS JetStream: the stream, consumers, a local nats-server and its roles
    emit/       the producer's side: sealing, the spool, the publisher, `Emitter`
    check/      verify, the row checks, the chain walk, replay
    decisions/  what a run must follow, and a person's review
    attest.py   model checkpoints signed (OpenSSF model signing) with in-toto SLSA provenance, and the check
    ingest/     the ledger service, and partitioned ingest
    local.py    the embedded default (`runledger.init` with no server starts one)

`runledger.ledger.Emitter` is the NATS producer (from `emit`).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Emitter":  # (on first use: importing a subpackage stays light)
        from runledger.ledger.emit.emitter import Emitter

        return Emitter
    raise AttributeError(f"module 'runledger.ledger' has no attribute {name!r}")
