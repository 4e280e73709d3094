"""lineage: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

import itertools
from pathlib import Path

LINEAGE_RUN = "lineage-run"


def write_ledger(root: Path) -> None:
    """A run of two worker attempts (the first fails, the second resumes from its checkpoint) with data,
    checkpoints and an agent's decision that the second attempt applies, by the ledger's own writer."""
    from runledger.ledger.contract.events import (
        CheckpointAsked,
        CheckpointSaved,
        DataRecorded,
        DataSource,
        DecisionApplied,
        DecisionMade,
        ResumedFrom,
        RunFinished,
        RunStarted,
    )
    from runledger.ledger.emit.sink import ParquetSink

    seqs, rows = itertools.count(1), []

    def sink(producer: str, attempt: int) -> ParquetSink:
        return ParquetSink(root, LINEAGE_RUN, producer, attempt, stream_seqs=seqs, rows=rows, flush_every=None)

    def at(second: int) -> str:
        return f"2026-11-29T10:00:{second:02d}.000000Z"

    w0, agent, w1 = sink("worker-0", 0), sink("agent-ckpt", 0), sink("worker-0", 1)
    w0.emit(RunStarted(config={"lr": 3e-4}, config_hash="c" * 64), time=at(0))
    w0.emit(DataRecorded(sources=[
        DataSource(domain="web", path="/data/web.bin", sha256="a" * 64, byte_start=0, byte_end=4096),
        DataSource(domain="math", path="domain:math", sha256="b" * 64, byte_start=100, byte_end=900)]), step=0, time=at(1))
    w0.emit(CheckpointSaved(path="/ckpt/step-10", bytes=1234, seconds=0.5, content_hash="h10"), step=10, time=at(5))
    agent.emit(DecisionMade(decision_id="d-1", agent="agent-ckpt", rule="silence", action="checkpoint_now",
                            rationale="telemetry silent", evidence={"rows": 3}), step=12, time=at(6))
    w0.emit(RunFinished(status="failed", reason="node lost"), step=12, time=at(7))
    w1.emit(RunStarted(config={"lr": 3e-4}, config_hash="c" * 64,
                       resumed_from=ResumedFrom(path="/ckpt/step-10", step=10, content_hash="h10")), step=10, time=at(10))
    w1.emit(DataRecorded(sources=[DataSource(domain="web", path="/data/web.bin", sha256="d" * 64, byte_start=4096,
                                             byte_end=8192)]), step=10, time=at(11))
    w1.emit(DecisionApplied(decision_id="d-1", action="checkpoint_now", before=CheckpointAsked(),
                            after=CheckpointAsked(checkpoint_step=11)), step=10, time=at(12))
    w1.emit(CheckpointSaved(path="/ckpt/step-11", bytes=1300, seconds=0.4, content_hash="h11", reason="requested"),
            step=11, time=at(13))
    w1.emit(RunFinished(status="completed", final_step=20), step=20, time=at(20))
    w1.flush()
