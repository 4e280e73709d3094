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
