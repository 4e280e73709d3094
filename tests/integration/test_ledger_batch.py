"""Batch messages checked at once (`check_batch`, `plain_batch`): the same verdicts as one at a time.

A batch in the plain form (what `Emitter` sends) is checked a column at a time and stored whole;
anything else is declined (None) and taken event by event (`check_envelope`), which says why an event
is invalid. These tests build batches with `seal`, break them one way at a time, and hold the two
paths to the same answer; then the ledger stores batches and overlaps of batches once each.
"""

from __future__ import annotations

import re

from runledger.ledger.check.verify import verify
from runledger.ledger.emit.emitter import Emitter
from runledger.tools.produce import step_payload
from support.reading import reader, stored_ids, wait_for_count

RUN, PRODUCER = "run-1", "worker-0"


# ----------------------------------------------------------------------------------- the ledger


# ----------------------------------------------------------------------------------- end to end


def test_events_emitted_in_batches_are_stored_once_each_with_their_chain(tmp_path, nats_server, root, ledger_process):
    ledger_process.start()
    emitted = []
    with Emitter(RUN, PRODUCER, 0, nats_server.url, tmp_path / "spool") as em:
        for chunk in range(12):
            first = em.next_seq
            emitted += em.emit_dicts("step", [step_payload(first + i) for i in range(250)],
                                    steps=list(range(first, first + 250)))
            emitted.append(em.emit_dict("eval", {"loss": 2.0 + chunk / 10}))
        assert em.flush(120)
    assert len(emitted) == 3_012
    sent = em.next_seq  # the 3,012, and with signed heads on the chain_head events the publisher sealed among them
    assert wait_for_count(root, "select count(*) from events", sent) == sent
    assert ledger_process.terminate() == 0
    messages = re.search(r"ledger stopped: messages (\d+)", ledger_process.log_path.read_text())
    assert int(messages[1]) < len(emitted) / 10  # most travelled in batches (a chunk is spooled at once)
    heads = [r[0] for r in reader(root).execute("select event_id from events where kind = 'chain_head'").fetchall()]
    assert len(heads) == sent - len(emitted)
    assert stored_ids(root) == sorted(emitted + heads)
    report = verify(root)
    assert report.ok, report.text()
    assert (report.events, report.chains) == (sent, 1)
