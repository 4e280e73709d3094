"""Attacks on the ledger service (issue 33): a hostile batch, a consumer or stream removed under a
running ledger, a catalog URI that does not open. Each test acts as the attacker (a worker publishing,
whoever can reach JetStream's API, a person at the CLI) and asserts the promise that must hold.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy, AckPolicy

from conftest import REPO, LedgerProcess, runledger
from ledger import service
from ledger.canonical import canonical_json
from ledger.events import STREAM, subject_for
from ledger import parsing
from ledger.sealing import seal
from ledger.store import read_events
from ledger.verify import verify

T0 = "2026-11-29T10:00:00.000000Z"
RUN, PRODUCER = "run-1", "worker-0"
WATCHDOG_S = 60.0  # generous: a ledger that hangs fails the test instead of hanging the suite


def chain(n: int, first: int = 0, prev: str = "", producer: str = PRODUCER, run_id: str = RUN) -> list[dict]:
    envs = []
    for seq in range(first, first + n):
        payload = {"loss": 1.0 + seq, "grad_norm": 0.5, "lr": 0.001, "tokens": 4096, "step_time_s": 0.1}
        env, _ = seal(run_id, producer, 0, seq, "step", payload, seq, prev, time=T0)
        envs.append(env)
        prev = env["hash"]
    return envs


def text(env: dict) -> bytes:
    return canonical_json(env).encode()


def array(*entries: bytes) -> bytes:
    return b"[" + b",".join(entries) + b"]"


def stored_ids(root: Path) -> list[str]:
    return sorted(read_events(root, columns=["event_id"]).column("event_id").to_pylist())


def quarantine_rows(root: Path) -> list[tuple]:
    import queries

    return queries.connect(root).execute("select reason, event_id from quarantine order by stream_seq").fetchall()


# ------------------------------------------------------------ one broken entry costs only itself


def not_utf8(env: dict) -> bytes:
    """The entry's text with a byte that is not UTF-8 inside a string (the producer's name)."""
    return text(env).replace(f'"producer":"{env["producer"]}"'.encode(), b'"producer":"worker-\xff\xfe"')


def cut_short(env: dict) -> bytes:
    return text(env)[: len(text(env)) // 2]


def hostile_batches(run_id: str = RUN) -> list[tuple[bytes, list[str], int]]:
    """Batches as a worker might publish them: (bytes, the event ids that must be stored, how many
    entries must be quarantined). Each is one chain's events 0..3 plus the hostile entries."""
    e = chain(4, run_id=run_id)
    ids = [x["event_id"] for x in e]
    bad2 = chain(4, producer="worker-9", run_id=run_id)[2]
    return [
        (array(text(e[0]), not_utf8(bad2), text(e[1]), text(e[2]), text(e[3])), ids, 1),  # invalid UTF-8 inside
        (array(text(e[0]), text(e[1]), text(e[2]), text(e[3]), cut_short(bad2))[:-1], ids, 1),  # last cut short
        (array(text(e[0]), text(e[1]), cut_short(bad2), text(e[2]), text(e[3])), ids, 1),  # middle cut short
        (array(text(e[0]), b"17", text(e[1]), b'"x"', text(e[2]), text(e[3])), ids, 2),  # non-objects
        (array(text(e[0]), array(text(bad2)), text(e[1]), text(e[2]), text(e[3])), ids, 1),  # a nested array
        (array(text(e[0]), text(e[1]), b'{"a":"\xc0\xaf", "b": [1, {"c": "]}"}]}', text(e[2]), text(e[3])), ids, 1),
        (array(text(e[0]), text(e[1]), text(e[2]), text(e[3]), b'{"x": NaN}', b"tru"), ids, 2),
    ]


@pytest.mark.parametrize("case", range(len(hostile_batches())))
def test_a_batchs_bad_entries_cost_only_themselves(root, case):
    data, must_store, n_bad = hostile_batches()[case]
    ledger = service.Ledger(root)
    decoded = ledger.decode([(subject_for(RUN, "step"), data, 1)])
    ledger.write(decoded)
    ledger.commit()
    assert stored_ids(root) == sorted(must_store)
    rows = quarantine_rows(root)
    assert len(rows) == n_bad and all(r[0].startswith("batch entry ") for r in rows), rows
    assert verify(root).ok


def test_the_splitter_keeps_strings_escapes_and_nesting_whole():
    data = b'[ {"a": "x,]\\"}", "b": [1, [2, {"c": "["}]]} , 3 ,"\xff,"]'
    assert parsing.split_batch(data) == [b'{"a": "x,]\\"}", "b": [1, [2, {"c": "["}]]}', b"3", b'"\xff,"']
    assert parsing.split_batch(b'[{"a": 1}, {"b": ') == [b'{"a": 1}', b'{"b":']
    assert parsing.split_batch(b"[]") == [] and parsing.split_batch(b"[ ]") == []


def test_a_hole_left_by_a_bad_middle_entry_is_named_by_verify_and_recorded_in_quarantine(root):
    e = chain(3)
    data = array(text(e[0]), not_utf8(e[1]), text(e[2]))
    ledger = service.Ledger(root)
    ledger.write(ledger.decode([(subject_for(RUN, "step"), data, 1)]))
    ledger.commit()
    assert stored_ids(root) == sorted([e[0]["event_id"], e[2]["event_id"]])
    (reason, event_id), = quarantine_rows(root)
    assert reason.startswith("batch entry 1:") and "utf-8" in reason.lower()
    report = verify(root)
    assert not report.ok and any("gap" in p or "missing" in p or "seq 1" in p for p in report.problems), report.problems


async def publish_all(url: str, messages: list[tuple[str, bytes]]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    from ledger import bus

    await bus.ensure_stream(js)
    for subject, data in messages:
        await js.publish(subject, data)
    await nc.close()


def test_a_worker_publishing_hostile_batches_loses_only_the_bad_entries(nats_server, root):
    """Published as a worker would, through JetStream, to a serving ledger."""
    msgs, must_store, n_bad = [], set(), 0
    for i in range(len(hostile_batches())):  # each case on its own run
        data, ids, bad = hostile_batches(f"run-{i}")[i]
        msgs.append((subject_for(f"run-{i}", "step"), data))
        must_store |= set(ids)
        n_bad += bad

    async def go():
        await publish_all(nats_server.url, msgs)
        await asyncio.wait_for(service.serve(root, nats_server.url, stop=asyncio.Event(), until_stored=len(must_store)),
                               WATCHDOG_S)

    asyncio.run(go())
    assert stored_ids(root) == sorted(must_store)
    assert len(quarantine_rows(root)) == n_bad
    assert verify(root).ok
