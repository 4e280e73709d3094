"""When an applied decision changes the plan, the forecast changes with it (issue 24): a small ladder
forecasts a target run; the throughput agent's decision shortens the target's horizon and the worker's
own decision code applies it; the ladder re-forecasts the new plan as revision 1, tied to the decision,
and leaves the registered forecast as it was; `audit forecast` lists the registered plan then the
revision, and `forecast_hit` judges each point against the plan in force there. Also: the joint fit's
projections fall with compute where one law per fraction wobbles, and a plan the ladder cannot speak for
says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runledger.ledger.contract.events import DecisionApplied, DecisionMade, RunFinished, RunStarted, StepCompleted
from runledger.ledger.emit.sink import ParquetSink
from runledger.queries.audit import run_suite
from runledger.training.decisions import apply_decision
from runledger.training.ladder import fit_ladder, forecast_made
from runledger.training.ladder_fit import FRACTIONS, Curve
from runledger.training.ladder_joint import non_monotone
from runledger.training.reforecast import PlanChange, Registered, lr_matched_fraction, revise_forecast, revisions
from runledger.training.schedule import make_schedule, retime
from support.ladder import FPT, LAW, T, law_loss, step_event
from support.reading import reader

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

RUNG_STEPS = (40, 120, 360, 1000)
HORIZON, DECIDED_AT, NEW_HORIZON = 3000, 600, 1200  # the target: planned, when the decision lands, shortened to
DECISION = "agent-throughput:target:throughput_contingency:3000"


def write_rung(root, name: str, steps: int, rng, seqs) -> Curve:
    """A rung as its worker would record it: run_started (tagged, with its schedule), steps, run_finished."""
    tokens = np.arange(1, steps + 1) * T
    loss = law_loss(tokens, rng)
    with ParquetSink(root, name, stream_seqs=seqs) as sink:
        sink.emit(RunStarted(config={"preset": "law"}, config_hash="0" * 64, token_budget=steps * T, tokens_per_step=T,
                             flops_per_token=FPT, schedule=make_schedule(3e-3, max(steps // 20, 1), steps, 0.05, T),
                             ladder={"name": "lad", "rung": 0, "target": "target"}), step=0)
        for k, y in enumerate(loss, 1):
            sink.emit(StepCompleted(loss=float(y), grad_norm=0.5, lr=1e-3, tokens=T, step_time_s=0.1), step=k)
        sink.emit(RunFinished(status="completed", final_step=steps, tokens_seen=steps * T), step=steps)
    return Curve(name, tokens.astype(float), loss, steps * T, FPT)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    """Rungs, the registered forecast, then the target: shortened at DECIDED_AT, revised, run to its new end."""
    root = tmp_path_factory.mktemp("revision")
    rng = np.random.default_rng(0)
    seqs = iter(range(1, 10**9))
    curves = [write_rung(root, f"lad-r{i}", s, rng, seqs) for i, s in enumerate(RUNG_STEPS)]
    forecasts, worst, _ = fit_ladder(curves, HORIZON * T * FPT)
    with ParquetSink(root, "target", "ladder", 0, stream_seqs=seqs) as sink:
        sink.emit_many([forecast_made(f, "target", HORIZON * T, worst, "joint") for f in forecasts])

    schedule = make_schedule(3e-3, 20, HORIZON, 0.05, T)
    cfg = None  # apply_decision passes the config through for a horizon decision
    with ParquetSink(root, "target", "worker-0", stream_seqs=seqs) as worker, \
            ParquetSink(root, "target", "agent-throughput", stream_seqs=seqs) as agent:
        worker.emit(RunStarted(config={"preset": "law"}, config_hash="0" * 64, token_budget=HORIZON * T,
                               tokens_per_step=T, flops_per_token=FPT, schedule=schedule), step=0)
        for k in range(1, DECIDED_AT + 1):
            worker.emit(step_event(k, schedule, rng), step=k)
        decision = DecisionMade(decision_id=DECISION, agent="agent-throughput", rule="throughput_contingency",
                                action="set_token_horizon", params={"horizon_steps": NEW_HORIZON},
                                rationale="the run would miss its deadline", evidence={})
        agent.emit(decision, step=DECIDED_AT)
        agent.flush()
        _, schedule, applied, _ = apply_decision(decision.model_dump(), DECIDED_AT + 1, cfg, schedule)
        assert applied["status"] == "applied"
        worker.emit(DecisionApplied.model_validate(applied), step=DECIDED_AT)
        worker.flush()
        registered = reader(root).execute("select event_id, hash, payload from forecasts order by fraction").fetchall()

        pending = revisions(root, "target")  # what the agents process does when it sees the applied decision
        with ParquetSink(root, "target", "ladder", 1, stream_seqs=seqs) as sink:
            for _, events in pending:
                sink.emit_many(events, [e.from_step - 1 for e in events])
        for k in range(DECIDED_AT + 1, NEW_HORIZON + 1):
            worker.emit(step_event(k, schedule, rng), step=k)
        worker.emit(RunFinished(status="completed", final_step=NEW_HORIZON, tokens_seen=NEW_HORIZON * T), step=NEW_HORIZON)
    return root, registered, pending


def test_the_revision_covers_the_new_horizon_and_names_its_decision(ledger):
    root, _, pending = ledger
    assert [d for d, _ in pending] == [DECISION]
    events = pending[0][1]
    assert [e.fraction for e in events] == list(FRACTIONS)
    assert {(e.revision, e.decision_id, e.horizon_tokens, e.from_step, e.from_tokens) for e in events} == {
        (1, DECISION, NEW_HORIZON * T, DECIDED_AT + 1, DECIDED_AT * T)}
    assert [e.target_tokens for e in events] == [round(g * NEW_HORIZON * T) for g in FRACTIONS]
    assert all(e.supported and e.rungs == [f"lad-r{i}" for i in range(4)] for e in events)
    assert all(any(DECISION in fl for fl in e.flags) for e in events)
    # the projection at the new end is of the smaller compute: higher than the registered plan's end
    stored = reader(root).execute("select decision_id, projected_loss from forecasts where fraction = 1.0 "
                                  "order by revision").fetchall()
    assert stored[0][0] is None and stored[1][0] == DECISION and stored[1][1] > stored[0][1]
    assert revisions(root, "target") == []  # revised once: asked again, nothing is pending


def test_the_registered_forecast_is_unchanged(ledger):
    root, registered, _ = ledger
    now = reader(root).execute("select event_id, hash, payload from forecasts where payload ->> 'decision_id' is null "
                               "order by fraction").fetchall()
    assert now == registered and len(now) == 20
    assert all(json.loads(p).get("revision", 0) == 0 for _, _, p in now)


def test_audit_forecast_lists_the_registered_plan_then_each_revision(ledger):
    root, _, _ = ledger
    results = {r.name: [dict(zip(r.columns, row)) for row in r.rows] for r in run_suite(root, "forecast", "target").results}
    plans = results["forecast/plans"]
    assert [(p["revision"], p["decision_id"]) for p in plans] == [(0, None), (1, DECISION)]
    assert plans[1]["agent"] == "agent-throughput" and plans[1]["applied_before_step"] == DECIDED_AT + 1
    assert plans[1]["horizon_tokens"] == NEW_HORIZON * T
    points = results["forecast/vs_actual"]
    assert [(p["revision"], p["fraction"]) for p in points] == [(r, g) for r in (0, 1) for g in FRACTIONS]
    for p in points:  # each point judged only where its plan governed the run
        governed = p["at_tokens"] <= DECIDED_AT * T if p["revision"] == 0 else p["at_tokens"] > DECIDED_AT * T
        assert p["in_force"] == governed, p
        assert (p["inside_band"] is not None) == (governed and p["reached"]), p
    # the registered plan's points past the run's real end are never reached
    assert not any(p["reached"] for p in points if p["revision"] == 0 and p["at_tokens"] > NEW_HORIZON * T)
    assert all(p["reached"] for p in points if p["revision"] == 1)


def test_forecast_hit_judges_each_point_against_the_plan_in_force(ledger):
    root, _, _ = ledger
    row = {r["check"]: r for r in run_suite(root, "health", "target").rows()}["forecast_hit"]
    ev = json.loads(row["evidence"])
    registered_in_force = sum(g * HORIZON <= DECIDED_AT for g in FRACTIONS)
    revised_in_force = sum(g * NEW_HORIZON > DECIDED_AT for g in FRACTIONS)
    assert ev["points"] == registered_in_force + revised_in_force
    assert ev["plan_in_force"] == {"revision": 1, "decision_id": DECISION}
    assert [(p["revision"], p["points"]) for p in ev["plans_judged"]] == [(0, registered_in_force), (1, revised_in_force)]
    assert row["status"] in ("ok", "warn", "fail")


def test_a_plan_below_the_smallest_rung_is_flagged_not_judged():
    rng = np.random.default_rng(1)
    curves = [Curve(f"r{i}", (np.arange(1, s + 1) * T).astype(float), law_loss(np.arange(1, s + 1) * T, rng), s * T, FPT)
              for i, s in enumerate(RUNG_STEPS)]
    reg = Registered("target", [c.name for c in curves], FPT, HORIZON * T, "joint", None, None)
    before = make_schedule(3e-3, 2, HORIZON, 0.05, T)
    change = PlanChange("d1", "set_token_horizon", 10, before, retime(before, 11, 20))
    events, refused = revise_forecast(curves, reg, change, 1, (0.05, 0.05))
    assert not refused and len(events) == 20
    assert all(not e.supported for e in events)
    assert all(any("below the smallest rung" in fl for fl in e.flags) for e in events)


def test_the_lr_matched_fraction_follows_the_schedule_in_force():
    before = make_schedule(1.0, 10, 200, 0.05, T)
    change = PlanChange("d", "set_token_horizon", 50, before, retime(before, 51, 100))
    assert lr_matched_fraction(100, change, 0.05, 0.05) == pytest.approx(1.0)  # the floor: a rung's end
    assert lr_matched_fraction(5, change, 0.05, 0.05) == pytest.approx(0.025)  # half way up warmup
    old = (50 - 10) / (200 - 10)  # before the decision: where the old schedule's decay was
    assert lr_matched_fraction(50, change, 0.05, 0.05) == pytest.approx(0.05 + old * 0.95)


def test_joint_projections_fall_with_compute_where_per_fraction_ones_wobble():
    rng = np.random.default_rng(3)
    curves = []
    for i, s in enumerate(RUNG_STEPS):
        tokens = np.arange(1, s + 1) * T
        loss = LAW.loss(tokens * FPT) * (1 + 0.02 * rng.standard_normal())  # each rung off the law by one draw
        curves.append(Curve(f"r{i}", tokens.astype(float), loss * (1 + 0.004 * rng.standard_normal(s)), s * T, FPT))
    counts = {}
    for method in ("joint", "per_fraction"):
        fc, _, _ = fit_ladder(curves, HORIZON * T * FPT, method=method)
        assert len(fc) == 20
        counts[method] = non_monotone([f.projected_loss for f in fc])
    assert counts["joint"] == 0
    assert counts["per_fraction"] > 0, counts


def test_the_report_draws_the_forecast_in_force_to_the_run_s_real_end(ledger):
    from runledger.tools.report import gather, render

    root, _, _ = ledger
    d = gather(root, "target")
    steps = [f["target_tokens"] / d["tps"] for f in d["forecasts"]]
    assert max(steps) == NEW_HORIZON  # the revised plan's end, not the registered 3000 steps
    assert all(f["revision"] == 0 for f in d["forecasts"] if f["target_tokens"] <= DECIDED_AT * T)
    assert all(f["revision"] == 1 and f["decision_id"] == DECISION for f in d["forecasts"] if f["target_tokens"] > DECIDED_AT * T)
    assert [(r["revision"], r["from_step"]) for r in d["revisions"]] == [(0, None), (1, DECIDED_AT + 1)]
    html = render("target", d)
    assert "forecast r1" in html and DECISION in html


def test_the_ladder_command_takes_the_fit_and_revise_options(tmp_path):
    import argparse

    from runledger.tools import ladder as ladder_command
    from runledger.tools.args import UsageError

    parser = argparse.ArgumentParser(prog="runledger")
    ladder_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ladder", "--target", "main", "--root", str(tmp_path), "--fit", "per-fraction",
                              "--horizon-steps", "160"])
    assert (args.fit, args.horizon_steps, args.revise) == ("per-fraction", 160, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["ladder", "--target", "main", "--fit", "both"])
    with pytest.raises(UsageError, match="--revise emits"):
        ladder_command.run(parser.parse_args(["ladder", "--target", "main", "--root", str(tmp_path), "--revise",
                                              "--no-emit"]))
    with pytest.raises(UsageError, match="--horizon-steps must be >= 1"):
        ladder_command.run(parser.parse_args(["ladder", "--target", "main", "--root", str(tmp_path),
                                              "--horizon-steps", "0"]))
