"""The ladder through the real ledger: forecasts fitted on rung curves go out as the target run's
`forecast` events, the ledger stores them, and `audit forecast` puts the target's observed loss
beside them at every 5%; rungs trained by the worker are tagged with their ladder in `run_started`
and their curves read back from the ledger match what the worker emitted."""

from __future__ import annotations

import pytest

from runledger.ledger.contract.events import RunFinished, RunStarted, StepCompleted
from runledger.ledger.emit.sink import ListSink
from runledger.training.ladder import RungSink
from support.ladder import schedule

SCHEDULE = schedule(10)


def test_rung_emitter_keeps_the_curve_of_a_rung_that_died():
    kept = ListSink()
    rec = RungSink(kept, {"name": "lad", "rung": 0})
    rec.emit(RunStarted(config={}, config_hash="0" * 64, tokens_per_step=512, token_budget=512 * 10,
                        flops_per_token=1e5, schedule=SCHEDULE), step=0)
    for k in range(1, 7):
        rec.emit(StepCompleted(loss=5.0 - 0.1 * k, grad_norm=0.5, lr=1e-3, tokens=512, step_time_s=0.1), step=k)
    rec.emit(StepCompleted(loss=None, grad_norm=None, lr=1e-3, tokens=512, step_time_s=0.1, skipped=True), step=7)
    rec.emit(RunFinished(status="failed"), step=7)
    c = rec.curve("lad-r0")
    assert not c.complete and c.reached == pytest.approx(0.6) and len(c.tokens) == 6
    assert kept.kinds() == ["run_started", *["step"] * 7, "run_finished"]  # every event passed on...
    assert kept.payloads("run_started")[0][1]["ladder"] == {"name": "lad", "rung": 0}  # ...run_started tagged


def test_ladder_command_parses_and_refuses_bad_usage(tmp_path):
    import argparse

    from runledger.tools import ladder as ladder_command
    from runledger.tools.args import UsageError

    parser = argparse.ArgumentParser(prog="runledger")
    ladder_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ladder", "--target", "main", "--root", str(tmp_path), "--E", "fit",
                              "--steps-scale", "0.5"])
    assert (args.preset, args.rungs, args.E, args.steps_scale, args.func) == ("small", 4, None, 0.5, ladder_command.run)
    with pytest.raises(UsageError, match="--rungs must be 1..4"):
        ladder_command.run(parser.parse_args(["ladder", "--target", "main", "--root", str(tmp_path), "--rungs", "5"]))
    with pytest.raises(UsageError, match="no run_started"):  # nothing in this ledger to re-fit
        ladder_command.run(parser.parse_args(["ladder", "--target", "main", "--root", str(tmp_path), "--from-ledger",
                                              "--no-emit"]))
