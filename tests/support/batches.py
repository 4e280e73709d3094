"""batches: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from runledger.ledger.contract.events import subject_for
from runledger.ledger.emit.sealing import seal


@dataclass(frozen=True)
class Batch:
    """A batch message: its subject's run and kind, the bytes, and what they parse to."""

    run_id: str
    kind: str
    data: bytes
    envs: list

    @property
    def subject(self) -> str:
        return subject_for(self.run_id, self.kind)


def text(old: bytes, new: bytes):
    def mutate(b: Batch) -> Batch:
        assert old in b.data
        data = b.data.replace(old, new, 1)
        return Batch(b.run_id, b.kind, data, orjson.loads(data))
    return mutate


def batch_for(runs: list[str], n: int, loss: float = 1.0, first_sseq: int = 1) -> list[tuple[str, bytes, int]]:
    """n step events of worker-0 per run, as (subject, bytes, stream sequence) from `first_sseq`."""
    msgs, sseq = [], first_sseq - 1
    for run in runs:
        prev = ""
        for s in range(n):
            env, text = seal(run, "worker-0", 0, s, "step",
                             {"loss": loss, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1}, s, prev)
            prev = env["hash"]
            sseq += 1
            msgs.append((subject_for(run, "step"), text.encode(), sseq))
    return msgs
