"""`runledger verify` finds any change to a stored file and names the event; `runledger replay` rebuilds a
run's state (resume, decisions, schedule) from its events, up to any stream position."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runledger import queries
from runledger.ledger.contract.canonical import canonical_json, event_hash
from runledger.ledger.storage.compaction import compact_partition
from runledger.ledger.storage.rows import StoredEvent, events_table
from support.processes import cli, verify
from support.runs import (
    RUN,
    SCHEDULE,
    Producer,
    Stream,
    build_run,
    ledger_root,  # noqa: F401 (fixtures)
    run_started,
    set_cell,
    step_payload,
    steps_file,
)

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)


def rewrite(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path)  # what someone editing the file by hand would do


def row_index(table: pa.Table, event_id: str) -> int:
    return table.column("event_id").to_pylist().index(event_id)


def test_verify_passes_on_a_clean_ledger(ledger_root):
    rc, out = verify(ledger_root)
    assert rc == 0, out
    assert "ok: every hash, chain and typed column checks out" in out
    assert "4 chains" in out


TARGET = "run-1:worker-0:0:3"  # step 2 of the first attempt, mid-chain


def test_a_changed_loss_column_is_found(ledger_root):
    f = steps_file(ledger_root)
    t = pq.read_table(f)
    rewrite(f, set_cell(t, "loss", row_index(t, TARGET), 0.123))
    rc, out = verify(ledger_root)
    assert rc == 1 and TARGET in out and "column loss = 0.123" in out, out


def test_a_changed_payload_text_is_found(ledger_root):
    f = steps_file(ledger_root)
    t = pq.read_table(f)
    i = row_index(t, TARGET)
    payload = json.loads(t.column("payload")[i].as_py())
    payload["loss"] = 0.123
    rewrite(f, set_cell(t, "payload", i, canonical_json(payload)))
    rc, out = verify(ledger_root)
    assert rc == 1 and TARGET in out and "hash does not match" in out, out


def test_a_deleted_row_is_found(ledger_root):
    f = steps_file(ledger_root)
    t = pq.read_table(f)
    i = row_index(t, TARGET)
    rewrite(f, pa.concat_tables([t.slice(0, i), t.slice(i + 1)]))
    rc, out = verify(ledger_root)
    assert rc == 1 and f"{TARGET} missing" in out, out


def test_an_inserted_row_is_found_even_with_a_correct_hash(ledger_root):
    f = steps_file(ledger_root)
    t = pq.read_table(f)
    env = {k: v for k, v in t.slice(row_index(t, TARGET), 1).to_pylist()[0].items()}
    forged = {**json.loads(env["payload"]), "loss": 0.5}
    fenv = {k: env[k] for k in ("event_id", "run_id", "producer", "attempt", "seq", "kind", "time", "step",
                                "schema_version", "prev_hash")} | {"payload": forged}
    fenv["hash"] = event_hash(fenv, canonical_json(forged))  # a careful forger
    row = events_table("step", [StoredEvent(fenv, canonical_json(forged), 999)], env["ingested_at"])
    rewrite(f, pa.concat_tables([t.slice(0, 2), row, t.slice(2)]))
    rc, out = verify(ledger_root)
    assert rc == 1 and f"{TARGET}: stored 2 times" in out, out


def test_two_swapped_seqs_are_found(ledger_root):
    f = steps_file(ledger_root)
    t = pq.read_table(f)
    a, b = row_index(t, "run-1:worker-0:0:3"), row_index(t, "run-1:worker-0:0:4")
    seqs = t.column("seq").to_pylist()
    t = set_cell(set_cell(t, "seq", a, seqs[b]), "seq", b, seqs[a])
    rewrite(f, t)
    rc, out = verify(ledger_root)
    assert rc == 1, out
    assert "run-1:worker-0:0:3 (" in out and "run-1:worker-0:0:4 (" in out, out
    assert "event_id does not match" in out, out


def test_a_second_copy_of_a_file_is_read_by_no_one_until_committed_and_then_found(ledger_root):
    from runledger.ledger.storage.tables import Tables

    f = steps_file(ledger_root)
    before = queries.connect(ledger_root).execute("select count(*) from steps_all").fetchone()
    copy = f.parent / "part-copy.parquet"
    copy.write_bytes(f.read_bytes())  # in the folder, in no snapshot: no reader reads it
    assert verify(ledger_root)[0] == 0
    assert queries.connect(ledger_root).execute("select count(*) from steps_all").fetchone() == before
    Tables(ledger_root).commit({"step": [copy]})  # an attacker who writes the catalog too
    rc, out = verify(ledger_root)
    assert rc == 1 and "run-1:worker-0:0:1: stored 2 times" in out, out


def replay(root: Path, *extra: str) -> dict:
    r = cli("replay", RUN, "--root", str(root), *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_replay_rebuilds_resume_decisions_and_schedule(root):
    marks = build_run(root)
    state = replay(root)
    assert state["status"] == "running"
    assert state["step"] == 9
    assert state["tokens_seen"] == 10 * 1000  # steps 4 and 5 were done twice, and count once
    assert state["schedule"] == {**SCHEDULE, "horizon_tokens": 8000}
    assert state["decisions"]["d1"]["status"] == "applied"
    assert state["decisions"]["d1"]["reviewed_by"] == "alice"
    assert state["decisions"]["d1"]["applied_at_step"] == 7
    assert set(state["attempts"]) == {"0", "1"}
    assert state["attempts"]["1"]["resumed_from"]["step"] == 3
    assert state["last_checkpoint"]["step"] == 3
    assert state["last_loss"] == 3.0
    assert state["last_stream_seq"] == state["events"] == 18

    before_applied = replay(root, "--as-of-seq", str(marks["applied"] - 1))
    assert before_applied["schedule"]["horizon_tokens"] == 10_000
    assert before_applied["decisions"]["d1"]["status"] == "approved"
    assert before_applied["last_stream_seq"] == marks["applied"] - 1

    before_approval = replay(root, "--as-of-seq", str(marks["approved"] - 1))
    assert before_approval["decisions"]["d1"]["status"] == "proposed"
    assert before_approval["tokens_seen"] == 4000 + 4 * 1000  # resumed at step 3, then steps 4..7

    at_proposal = replay(root, "--as-of-seq", str(marks["proposed"]))
    assert at_proposal["tokens_seen"] == 6 * 1000 and at_proposal["step"] == 5
    assert set(at_proposal["attempts"]) == {"0"}


def test_replay_takes_a_run_started_with_only_its_required_fields(root):
    """Every optional field of a payload may be left out (a user's own loop plans no token budget)."""
    from runledger.ledger.contract.events import KINDS

    s = Stream()
    w = Producer(RUN, "worker-0", 0)
    required = {n for n, f in KINDS["run_started"].model_fields.items() if f.is_required()}
    s.emit(w, "run_started", {k: v for k, v in run_started().items() if k in required}, 0)
    s.emit(w, "step", step_payload(2.0), 0)
    s.write(root)
    state = replay(root)
    assert state["token_budget"] is None and state["step"] == 0 and state["status"] == "running"


def test_replay_folds_in_stream_order_across_files(root):
    """Files are per kind; the fold must interleave them by stream_seq, not read them kind by kind."""
    build_run(root)
    rows = pq.read_table(steps_file(root))  # a compaction of the steps partition changes nothing
    compact_partition(steps_file(root).parent, min_files=1)
    assert pq.read_table(steps_file(root)).num_rows == rows.num_rows
    assert replay(root)["tokens_seen"] == 10_000


def test_a_truncated_file_is_reported_not_crashed_on(ledger_root):
    f = steps_file(ledger_root)
    f.write_bytes(f.read_bytes()[:200])
    rc, out = verify(ledger_root)
    assert rc == 1 and f"{f.name}: cannot be read" in out and "Traceback" not in out, out


@pytest.mark.parametrize("column", ["prev_hash", "seq", "stream_seq"])
def test_a_dropped_column_is_reported_not_crashed_on(ledger_root, column):
    f = steps_file(ledger_root)
    t = pq.read_table(f)
    rewrite(f, t.drop_columns([column]))
    rc, out = verify(ledger_root)
    assert rc == 1 and "Traceback" not in out, out
    assert f"no value in {column}" in out or "digest" in out, out


def test_an_emptied_cell_is_reported_not_crashed_on(ledger_root):
    f = steps_file(ledger_root)
    t = pq.read_table(f)
    rewrite(f, set_cell(t, "prev_hash", row_index(t, TARGET), None))
    rc, out = verify(ledger_root)
    assert rc == 1 and f"{TARGET} (" in out and "no value in prev_hash" in out, out
