"""The health checklist: for every check, a ledger written by the real writer with the fault planted
fires that check exactly there, and the healthy run beside it passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runledger.queries import audit  # noqa: E402
from support.audit_ledger import Ledger, write_run  # noqa: E402

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

# fault planted -> (the check that must fire, its status, the steps where it must say it fired)
FAULTS = {
    "grad_norm_spike": ("grad_norm_max", "fail", {250}),
    "grad_norm_rise": ("grad_norm_rise", "warn", set(range(305, 331))),
    "drop_fraction": ("drop_fraction", "fail", {200}),
    "loss_floor": ("loss_floor", "fail", {301}),
    "loss_rise": ("loss_decreasing", "warn", set(range(305, 341))),
    "eval_worse": ("eval_decreasing", "fail", {300}),
    "router_entropy": ("router_entropy", "fail", {201}),
    "param_norm": ("param_norm_growth", "warn", set(range(305, 331))),
    "throughput": ("mfu_below_plan", "fail", {201}),
    "mfu_dip": ("mfu_constant", "warn", {201}),
    "lr_off": ("lr_schedule", "fail", {250}),
    "lr_decision_ignored": ("lr_schedule", "fail", {202}),  # retimed from 201, where both lines still agree
    "checkpoint_config": ("config_match", "fail", {300}),
    "config_hash": ("config_match", "fail", {0}),  # the run_started whose config does not hash to it
    "silence": ("telemetry_silence", "fail", {250}),
    "skipped": ("skipped_steps", "fail", {305}),  # steps 100, 300, 305: 3 in 15 min
}


def run_id_for(fault: str) -> str:
    return "f-" + fault.replace("_", "-")


@pytest.fixture(scope="module")
def audit_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("audit") / "ledger"
    led = Ledger(root)
    write_run(led, "clean")
    for fault in FAULTS:
        write_run(led, run_id_for(fault), fault)
    # a horizon decision whose decision_applied says only the new horizon in `after`
    write_run(led, "horizon-only-retime", decision_style="horizon_only")
    # the skipped-step window narrowed to 60 s in run_started: step 100 drops out of it
    write_run(led, "f-skipped-60s", "skipped", thresholds={"skipped_window_s": 60})
    # a run that never finished, its last event long ago
    unfinished = Ledger(root)
    write_run(unfinished, "unfinished")
    led.rows += [r for r in unfinished.rows if r.env["kind"] != "run_finished"]
    # a ladder: a rung and two targets, one dropping like the rung and one dropping far more from mid-run
    write_run(led, "rung-a", ladder="lad", retime_at=None)
    write_run(led, "lad-clean", ladder="lad", retime_at=None)
    write_run(led, "lad-drops", "drops_vs_ladder", ladder="lad", retime_at=None)
    # forecasts: one run on its forecast, one that misses it at 50%
    write_run(led, "fc-clean", forecasts="hit")
    write_run(led, "fc-miss", forecasts="miss")
    # a run that logged steps only: no run_started, no drops, no evals
    bare = Ledger(root)
    write_run(bare, "bare", with_start=False)
    bare.rows = [r for r in bare.rows if r.env["kind"] in ("step", "run_finished")]
    led.rows += bare.rows
    led.write()
    return root


@pytest.fixture(scope="module")
def health(audit_root) -> dict[tuple[str, str], dict]:
    rows = audit.run_suite(audit_root, "health").rows()
    return {(r["run_id"], r["check"]): r for r in rows}


CHECKS = sorted({c for c, _, _ in FAULTS.values()} | {"drops_vs_ladder", "forecast_hit"})
# issue 43's checks (tests/unit/test_audit_marin.py plants their faults); every run here reports them too
ISSUE_43 = ["attempt_started", "checkpoints_advancing", "compute_thresholds", "loss_spike", "nonfinite_loss",
            "resume_matches", "router_bias", "run_down", "still_initializing", "telemetry_gone", "throughput_floor"]
ALL_CHECKS = sorted(CHECKS + ISSUE_43)


def test_every_check_reports_once_per_run(health):
    runs = {r for r, _ in health}
    assert {"clean", "bare", "rung-a", "ladder-fit"} <= runs
    assert len(health) == len(runs) * len(ALL_CHECKS)
    assert {c for _, c in health} == set(ALL_CHECKS)


def test_the_healthy_run_passes_every_check(health):
    statuses = {c: health[("clean", c)]["status"] for c in CHECKS}
    skipped = {c for c, s in statuses.items() if s == "skip"}
    assert skipped == {"drops_vs_ladder", "forecast_hit"}, statuses  # no ladder, no forecasts: said, not failed
    assert all(s == "ok" for c, s in statuses.items() if c not in skipped), statuses
    assert json.loads(health[("clean", "forecast_hit")]["evidence"])["reason"] == "no forecast events target this run"
    # of issue 43's: no heartbeat, no resume, no bias, no FLOPs per token: said, not failed
    new = {c: health[("clean", c)]["status"] for c in ISSUE_43}
    assert health[("f-skipped", "nonfinite_loss")]["status"] == "fail"  # (its skipped steps are NaN losses)
    assert {c for c, s in new.items() if s == "skip"} == {"resume_matches", "router_bias", "run_down", "telemetry_gone",
                                                           "compute_thresholds"}, new
    assert all(s in ("ok", "skip") for s in new.values()), new


@pytest.mark.parametrize("fault", FAULTS)
def test_a_planted_fault_fires_its_check_exactly_there(health, fault):
    check, status, steps = FAULTS[fault]
    row = health[(run_id_for(fault), check)]
    assert row["status"] == status, row
    assert row["at_step"] in steps, row
    assert health[("clean", check)]["status"] == "ok"


def test_drops_are_held_against_the_ladder_at_the_same_fraction(health):
    assert health[("lad-clean", "drops_vs_ladder")]["status"] == "ok"
    row = health[("lad-drops", "drops_vs_ladder")]
    assert row["status"] == "warn" and row["at_step"] == 200, row
    # 1% to 5% is under Marin's 7% alert, but five times the run's own level: the default form fails it there
    own = health[("lad-drops", "drop_fraction")]
    assert own["status"] == "fail" and own["at_step"] == 200, own


def test_the_projected_loss_is_hit_at_each_five_percent(health):
    assert health[("fc-clean", "forecast_hit")]["status"] == "ok"
    assert json.loads(health[("fc-clean", "forecast_hit")]["evidence"])["points"] == 19
    row = health[("fc-miss", "forecast_hit")]
    assert row["status"] == "fail" and row["at_step"] == 200, row


def test_absent_inputs_skip_with_a_reason_never_fail(health):
    bare = {c: health[("bare", c)] for c in CHECKS}
    for check in ("drop_fraction", "drops_vs_ladder", "eval_decreasing", "lr_schedule", "config_match", "forecast_hit"):
        assert bare[check]["status"] == "skip", bare[check]
        assert json.loads(bare[check]["evidence"])["reason"]
    assert not [c for c, r in bare.items() if r["status"] == "fail"]
    assert all(r["status"] == "skip" for (run, _), r in health.items() if run == "ladder-fit")


def test_the_lr_check_follows_applied_horizon_decisions_either_way_they_are_written(health):
    for run in ("clean", "horizon-only-retime"):
        row = health[(run, "lr_schedule")]
        assert row["status"] == "ok" and json.loads(row["evidence"])["retimes_applied"] == 1, row


def test_a_window_narrowed_in_run_started_is_the_one_used(health):
    row = health[("f-skipped-60s", "skipped_steps")]
    assert row["status"] == "fail" and row["at_step"] == 310 and row["value"] == 3, row
    assert json.loads(row["evidence"])["window_s"] == 60


def test_a_run_silent_since_its_last_event_fails_the_silence_check(health):
    row = health[("unfinished", "telemetry_silence")]
    assert row["status"] == "fail" and row["at_step"] == 400, row
    assert "no run_finished" in json.loads(row["evidence"])["longest_gap"]
    assert health[("clean", "telemetry_silence")]["status"] == "ok"


def test_thresholds_come_from_run_started_when_it_overrides_them(tmp_path):
    led = Ledger(tmp_path)
    write_run(led, "strict", thresholds={"grad_norm_max": 0.1})
    led.write()
    row = {r["check"]: r for r in audit.run_suite(tmp_path, "health", "strict").rows()}["grad_norm_max"]
    assert row["status"] == "fail" and row["threshold"] == 0.1 and row["at_step"] == 1


def test_one_run_alone_reads_the_same_as_all_runs(audit_root, health):
    for run in ("clean", run_id_for("lr_decision_ignored"), "lad-drops", "fc-miss", "bare", "f-skipped-60s"):
        alone = {r["check"]: r for r in audit.run_suite(audit_root, "health", run).rows()}
        assert alone == {c: health[(run, c)] for c in ALL_CHECKS}, run
