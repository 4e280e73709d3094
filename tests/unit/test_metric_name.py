"""`metric(name)`, the table macro of one metric: the same rows as the `metrics` view gives for that key,
whatever else the runs logged, and a name no run logged (a typo) is an error naming the close ones."""

from __future__ import annotations

import duckdb
import pytest

from runledger import queries
from runledger.ledger.storage import store
from support.runs import Producer, canonical

ROWS = "select run_id, attempt, step, value, nonfinite from {} order by all"


@pytest.fixture
def two_runs(tmp_path):
    """Two runs logging different names: run `a` train/loss and train/lr (one loss not finite), run `b`
    eval/loss only."""
    root = tmp_path / "root"
    a0, b = Producer("a", "worker-0", 0), Producer("b", "worker-0", 0)
    seq = iter(range(1, 10_000))
    events = []
    for s in range(10):
        loss = {"metrics": {"train/loss": None, "train/lr": 0.1}, "nonfinite": {"train/loss": "nan"}} if s == 3 else \
            {"metrics": {"train/loss": 1.0 / (s + 1), "train/lr": 0.1}}
        events.append(canonical(a0.event("metrics", loss, s, next(seq))))
        events.append(canonical(b.event("metrics", {"metrics": {"eval/loss": float(s)}}, s, next(seq))))
    store.write_events(root, events)
    return root


@pytest.mark.parametrize("name", ["train/loss", "train/lr", "eval/loss"])
def test_metric_gives_the_rows_of_metrics_for_its_name(two_runs, name):
    con = queries.connect(two_runs)
    by_macro = con.execute(ROWS.format(f"metric('{name}')")).fetchall()
    by_view = con.execute(ROWS.format(f"metrics where key = '{name}'")).fetchall()
    assert by_macro == by_view
    runs = {"train/loss": {"a"}, "train/lr": {"a"}, "eval/loss": {"b"}}[name]
    assert {r[0] for r in by_macro} == runs  # only the runs that logged it: no row of a run that did not
    assert len(by_macro) == 10  # a row per step it was logged at, the one not finite too:
    if name == "train/loss":
        assert ("a", 0, 3, None, "nan") in by_macro


def test_a_name_no_run_logged_is_an_error_naming_the_close_ones(two_runs):
    con = queries.connect(two_runs)
    with pytest.raises(duckdb.Error) as err:
        con.execute("select * from metric('train/los')").fetchall()
    message = str(err.value)
    assert "metric(\"train/los\"): no run logged this name" in message
    assert '"train/loss"' in message and '"train/lr"' not in message.split("did you mean")[0]
    with pytest.raises(duckdb.Error, match="lists the names logged"):
        con.execute("select * from metric('zzzz')").fetchall()


def test_a_logged_name_a_run_lacks_is_no_error(two_runs):
    assert queries.connect(two_runs).execute("select count(*) from metric('eval/loss') where run_id = 'a'").fetchone() == (0,)
