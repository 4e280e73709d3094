"""Forecasts that mean what they say (issue 45): degenerate ladders are refused or named, not forecast with
a band of zero width; a revision's ratio flag reads the rungs' own tokens per parameter; a ladder whose
rungs train at other ratios than the target's says so in its tag and its forecast; every band states its
level. (The retime boundary's test is in test_training_schedule.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from runledger.training.ladder import Rung, fit_ladder, forecast_made, ratio_flags, rung_tag
from runledger.training.ladder_fit import FRACTIONS, Curve, loss_at
from runledger.training.ladder_joint import JOINT_BAND_LEVEL, fit_joint
from runledger.training.reforecast import PlanChange, Registered, revise_forecast
from runledger.training.schedule import make_schedule, retime

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

FPT = 1e9
STEPS = (40, 120, 360, 1000)  # the rungs' steps: each ~3x the last in compute
T = 512  # tokens per step


def shaped(steps: int, loss_of_fraction) -> Curve:
    """A rung of `steps` steps whose loss is a function of its fraction of training only."""
    tokens = np.arange(1, steps + 1) * float(T)
    return Curve(f"r{steps}", tokens, loss_of_fraction(tokens / tokens[-1]), tokens[-1], FPT)


def test_identical_rung_curves_are_refused_at_every_fraction():
    """The same curve on every rung: compute does not move the loss. It was forecast with a zero-width band at
    19 of 20 fractions: the readings differ by the reading window's rounding (~1e-7), not by 1e-9."""
    curves = [shaped(s, lambda f: 2.0 + 1.5 * (1 - f) ** 2) for s in STEPS]
    refusals: dict[float, str] = {}
    forecasts, _, _ = fit_ladder(curves, 3e4 * T * FPT, refusals=refusals)
    assert forecasts == []
    assert sorted(refusals) == list(FRACTIONS)
    assert all("the same loss" in why or "no fraction" in why for why in refusals.values())


def test_a_reversed_ladder_says_so():
    """Loss rising with compute is a reversed ladder, not E "at a bound" that the rungs do not pin."""
    curves = [shaped(s, lambda f, k=k: 2.0 + 0.1 * k + (1 - f)) for k, s in enumerate(STEPS)]
    fit = fit_joint(curves)
    assert any(fl.startswith("reversed ladder") for fl in fit.flags)
    assert not any("do not pin it" in fl for fl in fit.flags)
    f = fit.forecast(3e4 * T * FPT, 0.5)
    assert any(fl.startswith("reversed ladder at 50%") for fl in f.flags)


def test_the_first_fraction_is_read_without_the_convex_steps_bias():
    """At 5% the +-5% window spans the first 10% of training, where the loss is convex in log tokens: a line
    read it +1% high on a curve with a data term; the reading is now within 0.2% of the curve."""
    tokens = np.arange(1, 201) * 5e6
    loss = 1.69 + 0.5 + 410.7 * tokens**-0.28
    c = Curve("r", tokens, loss, tokens[-1], FPT)
    for g in (0.05, 0.1, 0.5):
        truth = 1.69 + 0.5 + 410.7 * (g * tokens[-1]) ** -0.28
        assert loss_at(c, g)[0] == pytest.approx(truth, rel=2e-3), g


def test_the_joint_band_states_its_level_in_the_forecast_and_its_event():
    rng = np.random.default_rng(4)
    curves = [shaped(s, lambda f, s=s: 1.7 + 40 * (f * s * T * FPT) ** -0.12) for s in STEPS]
    curves = [Curve(c.name, c.tokens, c.loss * (1 + 0.01 * rng.standard_normal()), c.token_budget, FPT) for c in curves]
    f = fit_joint(curves).forecast(3e4 * T * FPT, 1.0)
    assert f.band_level == JOINT_BAND_LEVEL == 0.95
    event = forecast_made(f, "t", 3e4 * T, None, "joint")
    assert event.band_level == 0.95
    assert f.band_low <= f.projected_loss <= f.band_high


def test_the_revision_reads_the_ratio_off_the_rungs_own_tokens_per_parameter():
    """The rungs train at half the registered target's tokens per parameter (as the demo's do); a plan cut to
    half the horizon trains the target at the rungs' own ratio: no ratio flag. Before, the flag assumed the
    rungs trained at the registered ratio and said 0.50x."""
    rng = np.random.default_rng(5)
    curves = [shaped(s, lambda f, s=s: (0.6 + 30 * (f * s * T * FPT) ** -0.1) * (1 + 0.002 * rng.standard_normal()))
              for s in STEPS]
    horizon = 3000
    reg = Registered("t", [c.name for c in curves], FPT, horizon * T, "joint", None, None, rungs_tpp_ratio=0.5)
    before = make_schedule(3e-3, 150, horizon, 0.05, T)
    change = PlanChange("d", "set_token_horizon", 300, before, retime(before, 301, horizon // 2))
    events, _ = revise_forecast(curves, reg, change, 1, (0.05, 0.05))
    assert events and not any("tokens per active parameter" in fl for e in events for fl in e.flags)
    reg_same = Registered("t", reg.rungs, FPT, horizon * T, "joint", None, None, rungs_tpp_ratio=1.0)
    events, _ = revise_forecast(curves, reg_same, change, 1, (0.05, 0.05))
    assert all(any("0.50x the rungs' own tokens per active parameter" in fl for fl in e.flags) for e in events)


def test_a_revision_past_the_registered_horizon_is_flagged_per_point():
    rng = np.random.default_rng(6)
    curves = [shaped(s, lambda f, s=s: (0.6 + 30 * (f * s * T * FPT) ** -0.1) * (1 + 0.002 * rng.standard_normal()))
              for s in STEPS]
    horizon = 3000
    reg = Registered("t", [c.name for c in curves], FPT, horizon * T, "joint", None, None)
    before = make_schedule(3e-3, 150, horizon, 0.05, T)
    change = PlanChange("d", "set_token_horizon", 300, before, retime(before, 301, 2 * horizon))
    events, _ = revise_forecast(curves, reg, change, 1, (0.05, 0.05))
    past = [e for e in events if e.fraction * 2 > 1 + 1e-9]
    assert past and all(any(fl.startswith("extrapolated:") for fl in e.flags) for e in past)
    assert not any(fl.startswith("extrapolated:") for e in events if e not in past for fl in e.flags)
    assert all(e.band_low <= e.projected_loss <= e.band_high for e in events)


def test_rungs_off_the_target_s_ratio_are_flagged_and_tagged():
    """The demo's `--steps-scale 0.5` and the 10-step clamp trained its rungs 1.60x, 0.77x, 0.50x and 0.50x the
    target's tokens per parameter while the tag recorded one ratio for all."""
    target = 20.0
    flags = ratio_flags({"r0": 32.0, "r1": 15.4, "r2": 10.0, "r3": 10.0}, target)
    assert len(flags) == 1 and "r0 1.60x" in flags[0] and "r1 0.77x" in flags[0] and "r3 0.50x" in flags[0]
    assert ratio_flags({"r0": 20.5, "r1": 19.0}, target) == []
    tag = rung_tag("lad", Rung("lad-r0", "rung0", None, 0), "main", 32.0, target)
    assert tag["tokens_per_active_param"] == 32.0 and tag["target_tokens_per_active_param"] == target
    from runledger.ledger.contract.events import LadderRung

    LadderRung.model_validate(tag)  # the contract takes both


def test_a_fixed_E_the_data_reject_is_flagged_with_both_values():
    """With E fixed 0.32 too low the forecast was 0.03-0.04 nats low and said nothing. E is fitted too; where
    the fixed value lies outside the fitted E's interval, a flag gives both."""
    curves = [shaped(s, lambda f, s=s: 1.7 + 40 * (f * s * T * FPT) ** -0.12) for s in STEPS]  # no noise: E is pinned
    wrong = fit_joint(curves, E=1.7 - 0.32)
    flag = [fl for fl in wrong.flags if fl.startswith("the data reject the fixed E 1.38")]
    assert len(flag) == 1 and "fitted, E is 1.7" in flag[0]
    right = fit_joint(curves, E=1.7)
    assert not any("reject" in fl for fl in right.flags)


def test_the_demo_kills_the_worker_on_events_not_at_a_step_fixed_before_the_horizon_is_known(tmp_path):
    """On a loaded machine the throughput agent cut the horizon to 37, below the planned SIGKILL at step 60,
    and the resumed attempt never happened. The kill now follows the ledger: a checkpoint behind the worker,
    then (a)'s decision applied, or the horizon in force near."""
    from rich.console import Console

    from runledger.tools.demo import FULL, KILL_MARGIN, Demo, say_what_happened

    ledger = {"ckpt": 20, "shortened": 0}

    class Fake(Demo):
        def sql(self, query, default=None):
            return ledger["ckpt"] if "checkpoints" in query else ledger["shortened"]

    demo = Fake(tmp_path, FULL, Console())
    assert FULL.kill_after == 60
    assert not demo.should_kill(25, 160)  # nothing happened yet
    ledger["shortened"] = 1
    assert demo.should_kill(25, 37)  # (a) applied, a checkpoint behind: kill, well before step 60
    assert not demo.should_kill(20, 37)  # ...but only past the checkpoint, so the resumed attempt redoes steps
    ledger["shortened"] = 0
    assert demo.should_kill(37 - KILL_MARGIN, 37) and not demo.should_kill(37, 37)
    ledger["ckpt"] = 0
    assert not demo.should_kill(30, 37)  # no checkpoint to resume from yet
    console = Console(record=True, width=200)
    say_what_happened({"a_horizon_shortened": 1, "b_extension_held": 0, "c_resumed_attempts": 1}, console)
    text = console.export_text()
    assert "(a) the throughput agent shortened the horizon" in text and "(b) NOT shown: no hold_context_extension" in text
    assert "(c) the worker was SIGKILLed and resumed" in text
