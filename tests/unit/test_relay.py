"""A relayed event (`runledger push`) comes on its run's subject with `.relay.{relay}` after it: the
ledger takes it as the run's event and records who relayed the chain; on a secure server only the
relay role may publish there, and the relay role nowhere else."""

from __future__ import annotations

import fnmatch

from runledger.ledger.bus.natsserver import permissions
from runledger.ledger.contract.events import relay_subject_for, subject_for
from runledger.ledger.ingest import service
from runledger.ledger.storage import relays
from support.batches import batch_for


def allowed(role: str, subject: str, run_id: str | None = None) -> bool:
    """Whether `role` may publish `subject` (NATS wildcards: `*` one token, `>` the rest)."""
    def match(pattern: str) -> bool:
        p, s = pattern.split("."), subject.split(".")
        if p[-1] == ">":
            return len(s) >= len(p) and all(a == "*" or a == b for a, b in zip(p[:-1], s))
        return len(p) == len(s) and all(a == "*" or fnmatch.fnmatchcase(b, a) for a, b in zip(p, s))
    return any(match(p) for p in permissions(role, run_id)["publish"].get("allow", []))


def test_only_the_relay_role_publishes_relayed_subjects_and_it_nothing_else():
    relayed = relay_subject_for("run-a", "step", "relay", "ab12")
    assert allowed("relay", relayed)
    assert not allowed("relay", subject_for("run-a", "step"))  # never as a producer itself
    assert not allowed("relay", relay_subject_for("run-a", "step", "someone-else", "ab12"))
    for role, run in (("worker", "run-a"), ("agent", None), ("admin", None), ("notify", None)):
        assert not allowed(role, relayed, run) and not allowed(role, relay_subject_for("run-a", "step", f"worker-{run}", "ab12"), run)


def test_the_ledger_stores_a_relayed_event_and_records_who_relayed_its_chain(root):
    msgs = batch_for(["run-a"], 5)
    ledger = service.Ledger(root)
    relayed = [(relay_subject_for("run-a", "step", "relay", "ab12"), data, sseq) for _, data, sseq in msgs]
    ledger.write(ledger.decode(relayed))
    ledger.note_taken(5)
    ledger.commit()
    assert ledger.counters.stored == 5 and ledger.counters.quarantined == 0
    assert [(r["relay"], r["from"]) for r in relays.read_run(root, "run-a")["worker-0:0"]] == [("relay", "ab12")]
    odd = ledger.decode([(f"{subject_for('run-a', 'step')}.other.relay.ab12", msgs[0][1], 6)])
    assert not odd.events and "is not runledger.<run_id>.<kind>" in odd.rejected[0].reason
