"""One way to emit: typed events into an EventSink. A typed event seals to the same bytes as the dict
its fields make; a chain the Parquet sink writes is one `runledger verify` accepts, and the audits read;
the list sink keeps what a producer emitted, checked as a sealing sink would check it; the null sink
keeps nothing; each (re)started producer is given its next attempt by one rule."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

import pytest

from runledger.ledger.contract.events import (
    CheckpointSaved,
    DecisionMade,
    EvalCompleted,
    InvalidEvent,
    LayerDrops,
    RunFinished,
    StepCompleted,
    TokensDropped,
)
from runledger.ledger.emit.chains import next_attempt
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.emit.sink import EventSink, ListSink, NullSink, ParquetSink, kind_of, payload_of
from runledger.ledger.emit.spool import chain_dir
from support.processes import cli
from support.reading import reader

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


def step(k: int) -> StepCompleted:
    return StepCompleted(loss=10.0 / k, grad_norm=0.5, lr=1e-3, tokens=1024, step_time_s=0.1, mfu=0.4)


def drops(k: int) -> TokensDropped:
    layers = [LayerDrops(layer=i, assignments=512, sender_dropped=k % 3, receiver_dropped=i, drop_fraction=(k % 3 + i) / 512,
                         expert_loads=[64] * 8) for i in range(2)]
    return TokensDropped(dispatch="capacity", assignments=1024, dropped=2 * (k % 3) + 1,
                         drop_fraction=(2 * (k % 3) + 1) / 1024, layers=layers, cf_send=1.25, cf_recv=1.25)


def test_every_sink_is_an_event_sink(tmp_path):
    sinks = [ListSink(), NullSink(), ParquetSink(tmp_path / "root", "r1"),
             Emitter("r1", "worker-0", 0, "nats://127.0.0.1:1", tmp_path / "spool", confirm=False)]
    for sink in sinks:
        assert isinstance(sink, EventSink)
    sinks[-1].close(0.01)


def test_a_typed_event_is_its_kind_and_the_fields_it_was_given():
    ev = drops(4)
    assert kind_of(ev) == "drops" and kind_of(EvalCompleted(loss=1.0)) == "eval"
    assert payload_of(ev) == ev.model_dump(exclude_unset=True)  # nested models as dicts, defaults not added
    assert "probe" not in payload_of(ev) and payload_of(ev)["layers"][1]["receiver_dropped"] == 1
    with pytest.raises(TypeError, match="not an event payload"):
        kind_of(LayerDrops(layer=0, assignments=1, sender_dropped=0, receiver_dropped=0, drop_fraction=0.0))


def test_a_typed_event_seals_to_the_same_bytes_as_its_dict(tmp_path):
    typed, plain = (ParquetSink(tmp_path / name, "r1", stream_seqs=itertools.count(1)) for name in ("typed", "plain"))
    ids = typed.emit_many([step(1), step(2), drops(2), CheckpointSaved(path="c/2", bytes=1, seconds=0.1, content_hash="h")],
                          steps=[1, 2, 2, 2], time=T0)
    ids += [typed.emit(RunFinished(status="completed", final_step=2), step=2, time=T0)]
    plain.emit_dicts("step", [payload_of(step(1)), payload_of(step(2))], [1, 2], time="2026-11-01T12:00:00.000000Z")
    plain.emit_dict("drops", payload_of(drops(2)), 2, time=T0)
    plain.emit_dict("checkpoint", {"path": "c/2", "bytes": 1, "seconds": 0.1, "content_hash": "h"}, 2, time=T0)
    plain.emit_dict("run_finished", {"status": "completed", "final_step": 2}, 2, time=T0)
    assert [r.env["event_id"] for r in typed.rows] == ids == [f"r1:worker-0:0:{s}" for s in range(5)]
    assert [r.env["hash"] for r in typed.rows] == [r.env["hash"] for r in plain.rows]
    assert [r.env["prev_hash"] for r in typed.rows] == ["", *(r.env["hash"] for r in typed.rows[:-1])]


def test_a_chain_the_parquet_sink_writes_passes_verify_and_is_read_by_the_views(tmp_path):
    root = tmp_path / "root"
    seqs = itertools.count(1)  # one stream order for the sinks writing this root
    with ParquetSink(root, "r1", "worker-0", stream_seqs=seqs, flush_every=50) as worker, \
            ParquetSink(root, "r1", "agent-x", stream_seqs=seqs) as agent:
        for k in range(1, 121):
            worker.emit_many([step(k), drops(k)], steps=[k, k], time=T0)
            if k == 60:
                agent.emit(DecisionMade(decision_id="d1", agent="agent-x", rule="r", action="set_token_horizon",
                                        params={"horizon_steps": 100}, rationale="why"), step=k)
        worker.emit(RunFinished(status="completed", final_step=120), step=120)
    r = cli("verify", "--root", str(root))
    assert r.returncode == 0, r.stdout + r.stderr
    con = reader(root)
    assert con.execute("select count(*), max(step), count(distinct stream_seq) from steps").fetchone() == (120, 120, 120)
    assert con.execute("select params from decisions").fetchone()[0] == '{"horizon_steps":100}'
    # flushed as it went (every 50 events), and each file written by the ledger's own writer
    assert len(list((root / "events" / "kind=step" / "run_id=r1").glob("*.parquet"))) > 1
    assert ParquetSink(root, "r1", "worker-1").stream_seqs.__next__() == 243  # a new sink counts on from the root


def test_the_list_sink_keeps_the_events_and_checks_them_as_a_sealing_sink_would():
    sink = ListSink()
    sink.emit(step(1), step=1)
    sink.emit_many([drops(1), EvalCompleted(loss=2.0)], steps=[1, 1])
    assert sink.kinds() == ["step", "drops", "eval"] and sink.of("eval") == [(1, EvalCompleted(loss=2.0))]
    assert sink.payloads("step") == [(1, payload_of(step(1)))]
    unchecked = StepCompleted.model_construct(loss=float("nan"), grad_norm=0.5, lr=1e-3, tokens=-1, step_time_s=0.1)
    with pytest.raises(InvalidEvent):  # a model built without validation is refused, and nothing is kept
        sink.emit_many([step(2), unchecked], steps=[2, 2])
    assert len(sink.events) == 3 and sink.close() and sink.closed


def test_the_null_sink_keeps_nothing():
    sink = NullSink()
    assert sink.emit(step(1), step=1) is None and sink.emit_many([step(2)]) == [] and sink.close()
    assert sink.producer is None


def test_next_attempt_is_one_past_every_attempt_known(tmp_path):
    root, spool = tmp_path / "root", tmp_path / "root" / "spool"
    assert next_attempt("r1", "worker-0", spool, root=root) == 0  # nothing anywhere
    for attempt in (0, 1):
        with ParquetSink(root, "r1", "worker-0", attempt) as sink:
            sink.emit(step(1), step=1)
    assert next_attempt("r1", "worker-0", spool, root=root) == 2  # stored
    chain_dir(spool, "r1", "worker-0", 3).mkdir(parents=True)
    assert next_attempt("r1", "worker-0", spool, root=root) == 4  # spooled here, not stored yet
    assert chain_dir(spool, "r1", "worker-0", 4).is_dir()  # claimed: its folder made, so no one else takes 4
    chain_dir(spool, "r1", "worker-0", 4).rmdir()  # (as if that claim was never used)
    # a producer that continues its own outbox takes its newest spooled chain again, unless a newer one is stored
    assert next_attempt("r1", "worker-0", spool, root=root, continue_spooled=True) == 3
    with ParquetSink(root, "r1", "worker-0", 4) as sink:
        sink.emit(step(1), step=1)
    assert next_attempt("r1", "worker-0", spool, root=root, continue_spooled=True) == 5
    assert next_attempt("r1", "agent-x", spool, root=root) == 0  # per producer
