"""The rule book: every threshold the SQL or an agent reads is in queries/thresholds.py, once, with its
readers; a run's run_started.thresholds override it for the audit and the agents alike."""

from __future__ import annotations

import pytest


def test_a_run_may_set_only_thresholds_of_the_rule_book():
    """`runledger train --threshold` and `runledger.init(thresholds=)` refuse a name the rule book lacks
    (a typo would otherwise be recorded and silently never read), and take the former names too."""
    import runledger
    from runledger.tools.args import UsageError
    from runledger.tools.train import parse_thresholds

    assert parse_thresholds(["grad_norm_max=5", "window_steps=20"]) == {"grad_norm_max": 5.0, "window_steps": 20.0}
    for bad, reason in ((["grad_norm_mx=5"], "no threshold 'grad_norm_mx'"), (["grad_norm_max=high"], "is not a number")):
        with pytest.raises(UsageError, match=reason):
            parse_thresholds(bad)
    with pytest.raises(runledger.LogError, match="unknown thresholds grad_norm_mx"):
        runledger.init(name="typo", thresholds={"grad_norm_mx": 5.0}, mode="disabled")


def test_train_records_its_health_profile_and_refuses_an_unknown_one():
    """`runledger train --health PROFILE` puts the profile in the run's config, where `init(health=)` records it
    (the audit's run_plan reads it there); an unknown profile, or loss unit, is refused in one line."""
    from runledger.tools.cli import build_parser
    from runledger.tools.train import config_of
    from support.processes import cli

    parse = build_parser().parse_args
    assert config_of(parse(["train", "--run-id", "r", "--health", "marin"])).to_dict()["health"] == "marin"
    assert config_of(parse(["train", "--run-id", "r"])).to_dict()["health"] == "default"
    assert config_of(parse(["train", "--run-id", "r"])).to_dict()["loss_unit"] == "byte"  # the worker's own
    refused = cli("train", "--run-id", "r", "--health", "hero")
    assert refused.returncode == 2, refused
    [line] = [x for x in refused.stderr.splitlines() if "hero" in x]
    assert "'hero' is not a health profile: one of default, marin, marin-2024" in line, refused.stderr
    bad_unit = cli("train", "--run-id", "r", "--set", "loss_unit=bits", "--no-emit")
    assert bad_unit.returncode == 2 and "unknown loss unit 'bits'" in bad_unit.stderr, bad_unit
    assert len([x for x in bad_unit.stderr.splitlines() if "bits" in x]) == 1, bad_unit.stderr
