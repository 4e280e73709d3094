"""Each agent on planted evidence (it fires) and on clean evidence (it does not), through the real
path: a ledger written by the real writer, the agent's evidence query in DuckDB, the pure policy."""

from __future__ import annotations

import numpy as np
import pytest

from runledger.agents import drops, forecast, grad_norm, skipped, telemetry, throughput
from runledger.agents.runner import evaluate
from runledger.queries.audit import run_suite
from support.runs import make_run


def actions_of(root, agent, run_id="r"):
    _, actions = evaluate(root, run_id, agents=(agent,))
    return [a for _, a in actions]


def test_throughput_shortens_the_horizon_when_slow_in_the_first_quarter(root):
    make_run(root, step_time=lambda k: 2.0)  # half the planned 1,000 tokens/s
    [a] = actions_of(root, throughput)
    assert a.action == "set_token_horizon" and a.kind == "decision"
    assert 60 < a.params["horizon_steps"] < 400  # what fits in the planned 400 s at 500 tokens/s
    assert a.evidence["rows"][0]["recent_tokens_per_s"] == pytest.approx(500)


def test_throughput_is_quiet_on_plan_and_only_alerts_after_the_first_quarter(tmp_path):
    assert actions_of(make_run(tmp_path / "a"), throughput) == []
    late = make_run(tmp_path / "b", step_time=lambda k: 2.0, steps=150)  # 150/400 steps: past 25%
    [a] = actions_of(late, throughput)
    assert a.kind == "alert"


def test_throughput_holds_an_extended_run_to_its_flop_rate_not_its_old_tokens_per_s(tmp_path):
    """From step 20 the run trains at a length whose token costs twice the FLOPs: half the tokens/s of the
    plan, the planned FLOP rate exactly. Healthy: quiet. At half the FLOP rate too: it acts (issue 14)."""
    extended = lambda k: 1e6 if k < 20 else 2e6  # noqa: E731  FLOPs per token
    healthy = make_run(tmp_path / "healthy", step_time=lambda k: 1.0 if k < 20 else 2.0, fpt=extended)
    assert actions_of(healthy, throughput) == []
    slow = make_run(tmp_path / "slow", step_time=lambda k: 1.0 if k < 20 else 4.0, fpt=extended)
    [a] = actions_of(slow, throughput)
    assert a.action == "set_token_horizon"


def test_drops_raise_the_capacity_factor_then_go_dropless(tmp_path):
    assert actions_of(make_run(tmp_path / "clean"), drops) == []
    [a] = actions_of(make_run(tmp_path / "high", drop=lambda k: 0.12), drops)
    assert a.action == "set_capacity_factor" and a.params["cf_recv"] > 1.15
    [b] = actions_of(make_run(tmp_path / "maxed", drop=lambda k: 0.12, cf=(1.8, 1.9)), drops)
    assert b.action == "set_dispatch" and b.params == {"dispatch": "dropless"}


def test_drops_hold_a_context_extension_while_the_longer_length_drops_too_much(tmp_path):
    [a] = actions_of(make_run(tmp_path / "probe", probe=lambda k: 0.3), drops)
    assert a.action == "hold_context_extension"
    assert actions_of(make_run(tmp_path / "ok", probe=lambda k: 0.02), drops) == []


def test_grad_norm_alerts_above_the_threshold_and_on_a_rising_trend(tmp_path):
    assert actions_of(make_run(tmp_path / "clean"), grad_norm) == []
    # 3x its running median is no spike by default (7x is: issue 43); Marin's absolute 2.0 catches it
    assert actions_of(make_run(tmp_path / "3x", grad=lambda k: 3.0 if k == 58 else 1.0), grad_norm) == []
    [a] = [x for x in actions_of(make_run(tmp_path / "spike", grad=lambda k: 8.0 if k == 58 else 1.0), grad_norm)
           if x.rule == "grad_norm_high"]  # (the latest window's slope rises with it)
    assert "8.0x its running median" in a.rationale
    [a] = [x for x in actions_of(make_run(tmp_path / "marin", grad=lambda k: 3.0 if k == 58 else 1.0, health="marin"),
                                 grad_norm) if x.rule == "grad_norm_high"]
    assert "above 2.0" in a.rationale
    # rising from step 40: the latest window (5 blocks of 4 steps) rises ~90% of its mean, over the 50% limit
    rising = make_run(tmp_path / "rising", grad=lambda k: 0.5 + 0.05 * max(0, k - 40))
    [a] = [x for x in actions_of(rising, grad_norm) if x.rule == "grad_norm_rising"]
    steps = np.arange(41, 61)  # the latest window: blocks 10-14 of 4 steps (1% of the 400-step horizon)
    grads = 0.5 + 0.05 * np.maximum(0, steps - 40)
    row = a.evidence["rows"][0]
    assert (row["rise_from_step"], row["rise_step"]) == (41, 60)
    assert row["rise"] == pytest.approx(np.polyfit(steps, grads, 1)[0] * 19 / grads.mean())
    # one rule: the audit, which judges every window of the run, warns on the same run
    trend = {r["check"]: r for r in run_suite(rising, "health", "r").rows()}["grad_norm_rise"]
    assert trend["status"] == "warn" and trend["at_step"] <= 60
    clean = {r["check"]: r for r in run_suite(tmp_path / "clean", "health", "r").rows()}["grad_norm_rise"]
    assert clean["status"] == "ok"


def test_forecast_deviation_alerts_and_checkpoints(tmp_path):
    inside = make_run(tmp_path / "in", forecasts=[(0.1, 3.0, 2.8, 3.2)])
    assert actions_of(inside, forecast) == []
    outside = make_run(tmp_path / "out", forecasts=[(0.1, 2.0, 1.8, 2.2)])
    kinds = sorted((a.kind, a.action) for a in actions_of(outside, forecast))
    assert kinds == [("alert", None), ("decision", "checkpoint_now")]


def test_telemetry_silence_alerts_unless_the_run_finished(tmp_path):
    # the synthetic runs are from T0 (2026-11-01), long before now: silent for days
    [a] = actions_of(make_run(tmp_path / "silent"), telemetry)
    assert a.rule == "telemetry_silent"
    assert actions_of(make_run(tmp_path / "done", finished=True), telemetry) == []


def test_three_skipped_steps_roll_back_to_the_last_checkpoint(tmp_path):
    assert actions_of(make_run(tmp_path / "two", skipped_steps=(40, 41)), skipped) == []
    [a] = actions_of(make_run(tmp_path / "three", skipped_steps=(40, 41, 45)), skipped)
    assert a.action == "rollback" and a.params == {"to_step": 30}
