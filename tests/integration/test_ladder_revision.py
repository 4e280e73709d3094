"""When an applied decision changes the plan, the forecast changes with it (issue 24): a small ladder
forecasts a target run; the throughput agent's decision shortens the target's horizon and the worker's
own decision code applies it; the ladder re-forecasts the new plan as revision 1, tied to the decision,
and leaves the registered forecast as it was; `audit forecast` lists the registered plan then the
revision, and `forecast_hit` judges each point against the plan in force there. Also: the joint fit's
projections fall with compute where one law per fraction wobbles, and a plan the ladder cannot speak for
says so."""

from __future__ import annotations

import numpy as np

from runledger.ledger.contract.events import DecisionApplied, DecisionMade, RunFinished, RunStarted, StepCompleted
from runledger.training.decisions import apply_decision
from runledger.training.ladder import fit_ladder, forecast_made
from runledger.training.ladder_fit import Curve
from runledger.training.reforecast import revisions
from runledger.training.schedule import make_schedule
from support.ladder import FPT, T, law_loss, serve_in_thread, step_event
from support.reading import reader

RUNG_STEPS = (40, 120, 360, 1000)
HORIZON, DECIDED_AT, NEW_HORIZON = 3000, 600, 1200  # the target: planned, when the decision lands, shortened to
DECISION = "agent-throughput:target:throughput_contingency:3000"


def test_the_agents_process_re_forecasts_an_applied_plan_change_once(nats_server, root):
    """Through the real ledger: the runner, given the re-forecaster the command line gives it, records
    the revision as producer `ladder` (a fresh attempt) once the decision is applied, and not again."""
    from runledger.agents.runner import Runner
    from runledger.ledger.check.replay import replay_run
    from runledger.ledger.emit.emitter import Emitter
    from support.reading import wait_for_count

    rng = np.random.default_rng(5)
    thread, stop, loop = serve_in_thread(root, nats_server.url)
    try:
        curves = []
        for i, steps in enumerate(RUNG_STEPS[:3] + (600,)):
            em = Emitter(f"lad-r{i}", "worker-0", 0, nats_server.url, root / "spool")
            tokens = np.arange(1, steps + 1) * T
            loss = law_loss(tokens, rng)
            em.emit(RunStarted(config={"preset": "law"}, config_hash="0" * 64, token_budget=steps * T,
                               tokens_per_step=T, flops_per_token=FPT,
                               schedule=make_schedule(3e-3, max(steps // 20, 1), steps, 0.05, T)), step=0)
            em.emit_many([StepCompleted(loss=float(y), grad_norm=0.5, lr=1e-3, tokens=T, step_time_s=0.1) for y in loss],
                         list(range(1, steps + 1)))
            em.emit(RunFinished(status="completed", final_step=steps, tokens_seen=steps * T), step=steps)
            em.close()
            curves.append(Curve(f"lad-r{i}", tokens.astype(float), loss, steps * T, FPT))
        forecasts, worst, _ = fit_ladder(curves, HORIZON * T * FPT)
        em = Emitter("target", "ladder", 0, nats_server.url, root / "spool")
        em.emit_many([forecast_made(f, "target", HORIZON * T, worst, "joint") for f in forecasts])
        em.close()
        schedule = make_schedule(3e-3, 20, HORIZON, 0.05, T)
        worker = Emitter("target", "worker-0", 0, nats_server.url, root / "spool")
        worker.emit(RunStarted(config={"preset": "law"}, config_hash="0" * 64, token_budget=HORIZON * T,
                               tokens_per_step=T, flops_per_token=FPT, schedule=schedule), step=0)
        worker.emit_many([step_event(k, schedule, rng) for k in range(1, 51)], list(range(1, 51)))
        decision = DecisionMade(decision_id=DECISION, agent="agent-throughput", rule="throughput_contingency",
                                action="set_token_horizon", params={"horizon_steps": NEW_HORIZON},
                                rationale="the run would miss its deadline", evidence={})
        _, _, applied, _ = apply_decision(decision.model_dump(), 51, None, schedule)
        worker.emit(DecisionApplied.model_validate(applied), step=50)
        worker.close()
        total = sum(RUNG_STEPS[:3]) + 600 + 4 * 2 + 20 + 52
        mine = "select count(*) from events where kind <> 'chain_head'"  # (not the heads' signed chain_head events)
        assert wait_for_count(root, mine, total) == total

        runner = Runner(root, nats_server.url, revise=revisions)
        assert runner.reforecast("target", replay_run(root, "target")) == 20
        assert runner.reforecast("target", replay_run(root, "target")) == 0  # asked once per applied decision
        runner.close()
        assert wait_for_count(root, "select count(*) from forecasts", 40) == 40
        assert revisions(root, "target") == []  # the ledger has it: a restarted runner would not repeat it
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
    con = reader(root)
    assert con.execute("select attempt, count(*), min(payload ->> 'decision_id') from forecasts group by attempt "
                       "order by attempt").fetchall() == [(0, 20, None), (1, 20, DECISION)]
