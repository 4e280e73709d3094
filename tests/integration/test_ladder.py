"""The ladder through the real ledger: forecasts fitted on rung curves go out as the target run's
`forecast` events, the ledger stores them, and `audit forecast` puts the target's observed loss
beside them at every 5%; rungs trained by the worker are tagged with their ladder in `run_started`
and their curves read back from the ledger match what the worker emitted."""

from __future__ import annotations

import numpy as np
import pytest

from runledger.ledger.contract.events import RunFinished, RunStarted, StepCompleted
from runledger.ledger.emit.emitter import Emitter
from runledger.queries.audit import run_suite
from runledger.training.ladder import (
    LadderResult,
    Rung,
    curves_from_ledger,
    emit_forecasts,
    fit_ladder,
    rung_configs,
    train_rungs,
)
from runledger.training.ladder_fit import FRACTIONS, Curve, loss_at
from support.ladder import FPT, LAW, TOKENS_PER_STEP, schedule, serve_in_thread
from support.reading import reader, wait_for_count


def law_curve(name: str, budget_steps: int, rng, upto: float = 1.0) -> Curve:
    steps = np.arange(1, int(budget_steps * upto) + 1)
    tokens = steps * TOKENS_PER_STEP
    return Curve(name, tokens.astype(float), LAW.loss(tokens * FPT) * (1 + 0.005 * rng.standard_normal(len(steps))),
                 budget_steps * TOKENS_PER_STEP, FPT, complete=upto >= 1)


def emit_target(em: Emitter, steps: int, rng) -> None:
    """A target run whose loss follows the same law (what the worker would emit, minus the extras)."""
    budget = steps * TOKENS_PER_STEP
    em.emit(RunStarted(config={"preset": "law"}, config_hash="0" * 64, token_budget=budget,
                       tokens_per_step=TOKENS_PER_STEP, flops_per_token=FPT, schedule=schedule(steps)), step=0)
    for k in range(1, steps + 1):
        loss = float(LAW.loss(k * TOKENS_PER_STEP * FPT)) * (1 + 0.005 * rng.standard_normal())
        em.emit(StepCompleted(loss=loss, grad_norm=0.5, lr=1e-3, tokens=TOKENS_PER_STEP, step_time_s=0.1), step=k)
    em.emit(RunFinished(status="completed", final_step=steps, tokens_seen=budget), step=steps)


def test_forecasts_reach_the_ledger_and_the_audit_compares_them(nats_server, root):
    rng = np.random.default_rng(0)
    rungs = [law_curve("lad-r0", 40, rng), law_curve("lad-r1", 120, rng), law_curve("lad-r2", 360, rng),
             law_curve("lad-r3", 1000, rng, upto=0.85)]  # the last rung died at 85%
    target_steps = 3000
    target_tokens = target_steps * TOKENS_PER_STEP
    forecasts, worst, errors = fit_ladder(rungs, target_tokens * FPT, E=LAW.E)
    assert [f.fraction for f in forecasts] == list(FRACTIONS)
    assert set(errors) == {"lad-r0", "lad-r1", "lad-r2"} and worst < 0.1  # the crashed rung is not self-checked
    assert any("lad-r3: extrapolated from 85%" in fl for fl in forecasts[-1].flags)

    thread, stop, loop = serve_in_thread(root, nats_server.url)
    try:
        result = LadderResult("lad", "target", target_tokens * FPT, target_tokens, rungs, forecasts, worst, errors)
        assert emit_forecasts(result, root=root, nats_url=nats_server.url) == 20
        em = Emitter("target", "worker-0", 0, nats_server.url, root / "spool")
        emit_target(em, target_steps, rng)
        em.close()
        # (the events sent here; with signed heads on, each chain also holds chain_head events: not counted)
        mine = "select count(*) from events where kind <> 'chain_head'"
        assert wait_for_count(root, mine, 20 + target_steps + 2) == 20 + target_steps + 2
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)

    con = reader(root)
    stored = con.execute("select producer, attempt, count(*), min(self_check_error), max(self_check_error) "
                         "from forecasts where run_id = 'target' and target_run = 'target' group by all").fetchall()
    assert stored == [("ladder", 0, 20, pytest.approx(worst), pytest.approx(worst))]

    results = {r.name: [dict(zip(r.columns, row)) for row in r.rows] for r in run_suite(root, "forecast", "target").results}
    assert [(p["revision"], p["decision_id"], p["points"]) for p in results["forecast/plans"]] == [(0, None, 20)]
    rows = results["forecast/vs_actual"]
    assert [r["fraction"] for r in rows] == list(FRACTIONS)
    assert all(r["reached"] for r in rows)
    residuals = np.array([r["residual"] for r in rows])
    assert np.all(np.abs(residuals) < 0.1)
    assert sum(bool(r["inside_band"]) for r in rows) >= 10


def test_rungs_are_tagged_and_read_back_from_the_ledger(nats_server, root):
    (name, cfg), = rung_configs(1, tpp=0.01)  # MIN_RUNG_STEPS steps: one compile, shared by both rungs
    rungs = [Rung("lad-r0", name, cfg, 0), Rung("lad-r1", name, cfg, 1)]
    thread, stop, loop = serve_in_thread(root, nats_server.url)
    try:
        curves = train_rungs(rungs, ladder="lad", target_run="target", root=root, nats_url=nats_server.url, tpp=0.01,
                             peak_flops=1e11, stop_after={1: 7})  # the second rung dies at step 7
        assert wait_for_count(root, "select count(*) from runs_finished", 2) == 2
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
    assert [c.complete for c in curves] == [True, False]
    assert [len(c.tokens) for c in curves] == [cfg.steps, 7] and curves[1].reached == pytest.approx(7 / cfg.steps)

    con = reader(root)
    tags = con.execute("select run_id, ladder ->> 'name', (ladder ->> 'rung')::int, ladder ->> 'target' "
                       "from runs order by run_id").fetchall()
    assert tags == [("lad-r0", "lad", 0, "target"), ("lad-r1", "lad", 1, "target")]
    from runledger.training.flops import active_params

    # issue 45: the tag records each rung's own tokens per active parameter beside the target's; here the
    # MIN_RUNG_STEPS clamp trains the rungs far above the asked 0.01, which the tag now says
    own = cfg.token_budget / active_params(cfg)
    ratios = con.execute("select (ladder ->> 'tokens_per_active_param')::double, "
                         "(ladder ->> 'target_tokens_per_active_param')::double from runs order by run_id").fetchall()
    assert own > 0.011 and ratios == [(pytest.approx(own), pytest.approx(0.01))] * 2
    back = curves_from_ledger(root, ["lad-r0", "lad-r1"])
    for a, b in zip(curves, back):
        assert b.complete == a.complete and b.token_budget == a.token_budget
        assert b.flops_per_token == a.flops_per_token
        np.testing.assert_allclose(b.tokens, a.tokens)
        np.testing.assert_allclose(b.loss, a.loss, rtol=1e-6)
    _, flag = loss_at(back[1], 0.9)
    assert flag == "lad-r1: extrapolated from 70% to 90% (last 20%)"
