"""The learning-rate schedule: warmup, linear decay to 5% of peak at the horizon, and the retime a
horizon decision makes (it keeps the lr in force and still ends at 5% of peak at the new horizon)."""

import pytest

from runledger.training.schedule import lr_at, make_schedule, retime


def test_warmup_then_linear_decay_to_five_percent_of_peak():
    s = make_schedule(peak_lr=1e-3, warmup_steps=10, horizon_steps=110, min_lr_ratio=0.05)
    assert lr_at(1, **s) == pytest.approx(1e-4)
    assert lr_at(10, **s) == pytest.approx(1e-3)
    assert lr_at(60, **s) == pytest.approx(1e-3 + (0.05e-3 - 1e-3) * 0.5)
    assert lr_at(110, **s) == pytest.approx(0.05e-3)
    assert lr_at(500, **s) == pytest.approx(0.05e-3)
    lrs = [lr_at(k, **s) for k in range(10, 111)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))


def test_a_shorter_horizon_retimes_the_decay_from_the_decision_step():
    s = make_schedule(peak_lr=1e-3, warmup_steps=10, horizon_steps=1000, tokens_per_step=512)
    at = 200
    before = lr_at(at, **s)
    new = retime(s, at, 400)
    assert new["horizon_steps"] == 400 and new["horizon_tokens"] == 400 * 512
    assert lr_at(at, **new) == pytest.approx(before)  # no jump at the decision
    assert lr_at(400, **new) == pytest.approx(0.05e-3)  # still reaches 5% of peak at the new horizon
    assert lr_at(300, **new) == pytest.approx(before + (0.05e-3 - before) * 0.5)  # linear in between
    again = retime(new, 300, 350)  # a second decision composes
    assert lr_at(300, **again) == pytest.approx(lr_at(300, **new))
    assert lr_at(350, **again) == pytest.approx(0.05e-3)


def test_a_longer_horizon_and_a_decision_during_warmup():
    s = make_schedule(peak_lr=2e-3, warmup_steps=20, horizon_steps=100)
    longer = retime(s, 50, 200)
    assert lr_at(50, **longer) == pytest.approx(lr_at(50, **s))
    assert lr_at(200, **longer) == pytest.approx(1e-4)
    early = retime(s, 5, 300)  # during warmup only the horizon moves
    assert early["anchor_step"] is None
    assert lr_at(20, **early) == pytest.approx(2e-3) and lr_at(300, **early) == pytest.approx(1e-4)
    with pytest.raises(ValueError):
        retime(s, 50, 50)


def test_a_horizon_inside_warmup_or_not_ahead_is_refused():
    """Applied, a horizon at step 3 of a 20-step warmup would climb to 0.15x peak, then drop to the floor."""
    from runledger.training.config import PRESETS
    from runledger.training.decisions import apply_decision

    s = make_schedule(peak_lr=2e-3, warmup_steps=20, horizon_steps=100)
    with pytest.raises(ValueError, match="inside warmup"):
        retime(s, 5, 12)
    for at, horizon in ((5, 12), (5, 20), (30, 30), (30, 10)):
        decision = {"decision_id": "d", "action": "set_token_horizon", "params": {"horizon_steps": horizon}}
        cfg, new, applied, _ = apply_decision(decision, at, PRESETS["tiny"], s)
        assert applied["status"] == "refused" and new is s, (at, horizon)
        assert str(horizon) in applied["reason"]
    ok = apply_decision({"decision_id": "d", "action": "set_token_horizon", "params": {"horizon_steps": 22}},
                        5, PRESETS["tiny"], s)[2]
    assert ok["status"] == "applied"


def test_a_horizon_leaving_one_decay_step_is_refused():
    """Issue 45: warmup + 1 was accepted and fell from peak to the floor in one update; so was step + 1 after
    warmup. Every horizon leaving fewer than MIN_DECAY_STEPS decay updates is refused, one more is not."""
    from runledger.training.schedule import MIN_DECAY_STEPS

    s = make_schedule(peak_lr=2e-3, warmup_steps=20, horizon_steps=100)
    with pytest.raises(ValueError, match="1 decay step after step 20"):
        retime(s, 5, 21)  # during warmup: the horizon one update past its end
    with pytest.raises(ValueError, match="1 decay step after step 50"):
        retime(s, 50, 51)
    new = retime(s, 50, 50 + MIN_DECAY_STEPS)
    peak_to_floor = lr_at(50, **s) - lr_at(50 + MIN_DECAY_STEPS, **new)
    assert max(lr_at(k, **new) - lr_at(k + 1, **new) for k in range(50, 50 + MIN_DECAY_STEPS)) <= peak_to_floor / 2 + 1e-12


def test_the_train_cli_refuses_a_horizon_inside_warmup(tmp_path, caplog):
    """`runledger train --horizon-steps 3` on `tiny` (5 warmup steps): one line and exit 2, no training."""
    from runledger.tools.cli import main as runledger_main

    rc = runledger_main(["train", "--preset", "tiny", "--run-id", "warm", "--root", str(tmp_path), "--no-emit",
                         "--no-decisions", "--steps", "1", "--horizon-steps", "3"])
    assert rc == 2
    assert "--horizon-steps 3: new horizon 3 is inside warmup" in caplog.text
