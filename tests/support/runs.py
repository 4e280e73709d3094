"""runs: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runledger.ledger.emit.sink import ParquetSink
from runledger.ledger.storage import paths, store
from runledger.ledger.storage.digest import with_digest
from runledger.ledger.storage.rows import StoredEvent
from runledger.training.schedule import make_schedule
from support.audit_ledger import T0, Ledger

RUN = "run-1"


class Stream:
    """Events in the order JetStream would have stored them, written by the real writer."""

    def __init__(self) -> None:
        self.rows: list[StoredEvent] = []

    def emit(self, producer: Producer, kind: str, payload: dict, step: int | None) -> int:
        self.rows.append(canonical(producer.event(kind, payload, step, len(self.rows) + 1)))
        return len(self.rows)  # its stream sequence

    def write(self, root: Path) -> None:
        store.write_events(root, self.rows)


def run_started(resumed_from: dict | None = None) -> dict:
    return {"config": {"d_model": 64}, "config_hash": "cfg1", "token_budget": 10_000, "tokens_per_step": 1000,
            "schedule": SCHEDULE, "resumed_from": resumed_from}


def build_run(root: Path) -> dict[str, int]:
    """A run that is resumed from a checkpoint, and whose horizon is shortened by an approved decision."""
    s, marks = Stream(), {}
    w0, w1 = Producer(RUN, "worker-0", 0), Producer(RUN, "worker-0", 1)
    agent, person = Producer(RUN, "agent-horizon", 0), Producer(RUN, "cli", 0)
    s.emit(w0, "run_started", run_started(), 0)
    for step in range(6):
        s.emit(w0, "step", step_payload(5.0 - 0.1 * step), step)
        if step == 3:
            s.emit(w0, "checkpoint", {"path": "/ckpt/3", "bytes": 10, "seconds": 0.1, "content_hash": "h3",
                                      "tokens_seen": 4000}, 3)
    marks["proposed"] = s.emit(agent, "decision", {
        "decision_id": "d1", "agent": "agent-horizon", "rule": "loss_on_track", "action": "set_token_horizon",
        "params": {"horizon_tokens": 8000}, "rationale": "projected loss reached early", "mode": "proposed"}, 5)
    # worker-0 died after step 5; attempt 1 resumes from the step-3 checkpoint and re-does steps 4 and 5
    s.emit(w1, "run_started", run_started({"path": "/ckpt/3", "step": 3, "content_hash": "h3"}), 4)
    for step in range(4, 8):
        s.emit(w1, "step", step_payload(4.0 - 0.1 * step), step)
    marks["approved"] = s.emit(person, "decision", {
        "decision_id": "d2", "agent": "alice", "rule": "manual", "action": "approve", "params": {"decision_id": "d1"},
        "rationale": "agreed"}, 7)
    marks["applied"] = s.emit(w1, "decision_applied", {
        "decision_id": "d1", "action": "set_token_horizon", "before": {"horizon_tokens": 10_000},
        "after": {"horizon_tokens": 8000}}, 7)
    for step in range(8, 10):
        s.emit(w1, "step", step_payload(3.0), step)
    s.write(root)
    return marks


@pytest.fixture
def ledger_root(root) -> Path:
    build_run(root)
    return root


def steps_file(root: Path) -> Path:
    (f,) = paths.event_files(root, "step", RUN)
    return f


def set_cell(table: pa.Table, column: str, i: int, value) -> pa.Table:
    values = table.column(column).to_pylist()
    values[i] = value
    j = table.schema.get_field_index(column)
    return table.set_column(j, table.schema.field(j), pa.array(values, table.schema.field(j).type))


class Producer:
    """One chain sealed by a Parquet sink (runledger.ledger.emit.sink), each event handed back to the test with the
    stream seq it is given, to write when and how the test likes."""

    def __init__(self, run_id: str = "run-1", producer: str = "worker-0", attempt: int = 0):
        self.stream_seq = 0
        self.sink = ParquetSink(".", run_id, producer, attempt, stream_seqs=iter(lambda: self.stream_seq, None),
                                flush_every=None)

    def event(self, kind: str, payload: dict, step: int | None, stream_seq: int) -> StoredEvent:
        self.stream_seq = stream_seq
        self.sink.emit_dict(kind, payload, step, time=T0)
        return self.sink.rows.pop()


def step_payload(loss: float, tokens: int = 1000) -> dict:
    return {"loss": loss, "grad_norm": 1.0, "lr": 1e-3, "tokens": tokens, "step_time_s": 0.1}


def canonical(ev: StoredEvent) -> StoredEvent:
    from runledger.ledger.contract.canonical import canonical_json

    ev.payload_text = canonical_json(ev.env["payload"])
    return ev


def make_run(root, run_id="r", *, step_time=lambda k: 1.0, planned=1000.0, deadline=None, steps=60,
             drop=lambda k: 0.01, cf=(1.1, 1.15), dispatch="capacity", probe=None, grad=lambda k: 1.0,
             skipped_steps=(), checkpoints=(10, 30), forecasts=(), loss=lambda k: 3.0, finished=False,
             last_event_age_s=0.0, fpt=None, health=None):
    led = Ledger(root)
    t = T0
    led.emit(run_id, "run_started", {
        "config": {"health": health} if health else {}, "config_hash": "0" * 64, "token_budget": STEPS * TPS, "tokens_per_step": TPS,
        "schedule": make_schedule(1e-3, 10, STEPS, 0.05, tokens_per_step=TPS),
        "planned_tokens_per_s": planned, "deadline_s": deadline, "flops_per_token": fpt and fpt(0)}, 0, t)
    for k in range(1, steps + 1):
        t += timedelta(seconds=step_time(k))
        sk = k in skipped_steps
        led.emit(run_id, "step", {"loss": None if sk else loss(k), "grad_norm": grad(k), "lr": 1e-3, "tokens": TPS,
                                  "step_time_s": step_time(k), "skipped": sk, "flops_per_token": fpt and fpt(k)}, k, t)
        led.emit(run_id, "drops", {"dispatch": dispatch, "assignments": 1000, "dropped": int(drop(k) * 1000),
                                   "drop_fraction": drop(k), "cf_send": cf[0], "cf_recv": cf[1], "seq_len": 64}, k, t)
        if probe is not None:
            led.emit(run_id, "drops", {"dispatch": dispatch, "assignments": 1000, "dropped": int(probe(k) * 1000),
                                       "drop_fraction": probe(k), "seq_len": 256, "probe": True}, k, t)
        if k in checkpoints:
            led.emit(run_id, "checkpoint", {"path": f"/ckpt/{k}", "bytes": 1, "seconds": 0.1, "content_hash": "h"}, k, t)
    for frac, proj, lo, hi in forecasts:
        led.emit(run_id, "forecast", {"target_run": run_id, "fraction": frac, "target_tokens": int(frac * STEPS * TPS),
                                      "projected_loss": proj, "band_low": lo, "band_high": hi},
                 None, t, producer="ladder")
    if finished:
        led.emit(run_id, "run_finished", {"status": "completed"}, steps, t)
    led.write()
    return root


# The smallest valid payload of each kind (only required fields).
MINIMAL = {
    "run_started": {"config": {"d_model": 64}, "config_hash": "c0ffee", "token_budget": 1_000_000, "schedule": {}},
    "step": {"loss": 2.5, "grad_norm": 0.9, "lr": 3e-4, "tokens": 8192, "step_time_s": 0.25},
    "drops": {"dispatch": "capacity", "assignments": 100, "dropped": 3, "drop_fraction": 0.03},
    "eval": {"loss": 2.7},
    "checkpoint": {"path": "/ckpt/100", "bytes": 1234, "seconds": 1.5, "content_hash": "ab12"},
    "data": {},
    "forecast": {"target_run": "big", "fraction": 0.05, "projected_loss": 2.1, "band_low": 2.0, "band_high": 2.2},
    "alert": {"alert_id": "a1", "agent": "worker-0", "rule": "mfu_low", "message": "MFU below plan"},  # its producer's
    "decision": {"decision_id": "d1", "agent": "agent-drops", "rule": "drops", "action": "set_capacity_factor",
                 "rationale": "drop fraction above 7%"},
    "decision_applied": {"decision_id": "d1", "action": "set_capacity_factor"},
    "run_finished": {"status": "completed"},
    "metrics": {"metrics": {"val/accuracy": 0.5, "router/layer_3/entropy": 2.0}},
    "system": {"metrics": {"cpu/percent": 12.5}},
    "config": {"config": {"lr": 0.001}},
    "artifact": {"path": "/data/model.pt", "sha256": "0" * 64, "bytes": 7, "via": "save"},
    "attestation": {"path": "/ckpt/run/step_00000008", "subject_sha256": "1" * 64, "statement_sha256": "2" * 64,
                    "key_id": "3" * 64},
    "heartbeat": {"host": "node-1", "pid": 4242, "interval_s": 30.0},
    "alert_ack": {"alert_id": "loss-spike", "by": "alice", "via": "webhook"},
    "histogram": {"key": "grads", "edges": [-1.0, 0.0, 0.5], "counts": [3, 4], "count": 7, "min": -0.75, "max": 0.5,
                  "sum": 0.25, "sum_squares": 2.5},
    "table": {"key": "samples", "columns": ["prompt", "score"], "rows": [["hi", 0.5], [None, True]], "rows_logged": 3},
    "console": {"stream": "stdout", "first": 3, "lines": ["epoch 1", "loss 0.5"], "dropped": 1},
    "media": {"key": "sample", "sha256": "0" * 64, "bytes": 7, "type": "image/png", "caption": "step 1"},
    "tombstone": {"chains": [{"producer": "worker-0", "attempt": 0, "seq": 3, "hash": "b" * 64}], "events": 4,
                  "by": "alice", "authority": "os_user"},
    "chain_head": {"upto_seq": 0, "head": "c" * 64, "note": "runledger/chain-head/v1\n"},
}


def rewrite_partition(root, kind: str, run_id: str, keep, change=None, fresh_digest: bool = True) -> None:
    """Rewrite each of a partition's files in place with the rows `keep(row)` accepts, `change(table)`
    applied; with the ledger's own digest recomputed (the attacker knows the format) unless
    `fresh_digest` is False. (Every file stays where the tables' snapshot says it is.)"""
    for f in paths.event_files(root, kind, run_id):
        table = pq.read_table(f)
        metadata = table.schema.metadata
        table = table.replace_schema_metadata(None).filter(pa.array([keep(r) for r in table.to_pylist()], pa.bool_()))
        if change is not None:
            table = change(table)
        table = with_digest(table) if fresh_digest else table.replace_schema_metadata(metadata)
        pq.write_table(table, f)


TPS = 1000  # tokens per step


STEPS = 400


SCHEDULE = {"peak_lr": 1e-3, "warmup_steps": 2, "horizon_tokens": 10_000, "min_lr_ratio": 0.05}


def listed_run(root: Path, run_id: str = "listed", mode: str = "online"):
    """A `runledger.core.Run` logging into a list sink (each event checked against the contract, none sent): (run, sink)."""
    from runledger.core import Run
    from runledger.ledger.emit.sink import ListSink

    sink = ListSink("main")
    return Run(run_id, project=None, name=None, root=root, sink=sink, attempt=0, config={}, tags=[], first_step=0,
               attachment=None, mode=mode), sink


def resealed(env: dict) -> dict:
    """`env` with its hash made again for its payload as it now is: a producer's own edited event, hashed correctly."""
    from runledger.ledger.contract.canonical import canonical_json, event_hash

    env["hash"] = event_hash(env, canonical_json(env["payload"]))
    return env
