"""Attacks on free-form metric names (`runledger.log`), as another run logging to the same root: names
that differ only in case or Unicode form must not rename, merge or blank another run's metrics, and
a run logging thousands of new names must not widen the shared table for every other run. Each test
logs as a user would (the embedded local server and ledger), then reads back with SQL, the dashboard's
reader and `verify`, and edits a stored file as an attacker who knows the format.
"""

from __future__ import annotations

import logging
import unicodedata

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import runledger
from runledger.ledger.contract.columns import WIDE_COLUMNS_MAX, WIDE_COLUMNS_PER_RUN
from runledger.ledger.contract.metricnames import metric_name
from runledger.ledger.storage.compaction import compact_partition
from runledger.ledger.storage.files import partition_dir
from runledger.ledger.storage.reads import read_events
from support.processes import cli
from support.reading import reader
from support.runs import rewrite_partition

CAFE_NFC = unicodedata.normalize("NFC", "café")
CAFE_NFD = unicodedata.normalize("NFD", "café")
CYRILLIC_LOSS = "l\u043ess"  # "lоss" with a Cyrillic о
LOGGED = {  # run -> step -> name -> value: names that collide under case-folding or normalisation
    "case-a": {s: {"loss": 1.0 + s} for s in range(3)},
    "case-b": {s: {"Loss": 10.0 + s} for s in range(3)},
    "case-c": {s: {"LOSS": 100.0 + s, CAFE_NFC: 0.5 + s, CAFE_NFD: 0.25 + s, CYRILLIC_LOSS: 7.0 + s,
                   "a b%20+é/x": 3.0 + s} for s in range(3)},
}


def log_runs(logged: dict, resume: bool = False) -> None:
    for run_id, steps in logged.items():
        run = runledger.init(id=run_id, project="names", system_metrics=False, resume=resume)
        for step, values in steps.items():
            runledger.log(values, step=step)
        assert run.finish(wait=True)  # (the tables are read directly next: stored first)


def stored_metrics(root, run_id: str) -> dict:
    rows = reader(root).execute("select step, key, value from metrics where run_id = ?", [run_id]).fetchall()
    out: dict = {}
    for step, key, value in rows:
        assert key not in out.setdefault(step, {}), f"{run_id}: {key!r} twice at step {step}"
        out[step][key] = value
    return out


def test_names_differing_only_in_case_or_normal_form_read_back_exactly_per_run(local_root):
    log_runs(LOGGED)
    for run_id, steps in LOGGED.items():
        assert stored_metrics(local_root, run_id) == steps  # view `metrics`: every name as logged, not merged
        for name in steps[0]:
            got = reader(local_root).execute("select step, value from metric(?) where run_id = ? order by step",
                                             [name, run_id]).fetchall()
            assert got == [(s, v[name]) for s, v in steps.items()], (run_id, name)
        for other, other_steps in LOGGED.items():  # no other run's name reads as this one's
            if other != run_id:
                for name in other_steps[0]:
                    if name not in steps[0]:
                        assert reader(local_root).execute("select count(value) from metric(?) where run_id = ?",
                                                          [name, run_id]).fetchone()[0] == 0, (run_id, name)
    from runledger.ui.data import Reader

    dashboard = Reader(local_root, threads=1)
    for run_id, steps in LOGGED.items():
        assert sorted(dashboard.keys(run_id)["metrics"]) == sorted(steps[0]), run_id
        name = next(iter(steps[0]))
        points = dashboard.series(run_id, "metrics", [name])["keys"][name]
        assert [y for _, (xs, ys) in sorted(points.items()) for y in ys] == [v[name] for v in steps.values()]
    assert cli("verify", "--root", str(local_root)).returncode == 0

    def halve(table: pa.Table) -> pa.Table:  # the column holding run b's "Loss", whatever it is named
        i = next(i for i, n in enumerate(table.column_names) if n.startswith("metrics/") and metric_name(n) == "Loss")
        return table.set_column(i, table.column_names[i], pc.multiply(table.column(i), 0.5))

    rewrite_partition(local_root, "metrics", "case-b", lambda r: True, halve)
    out = cli("verify", "--root", str(local_root))
    assert out.returncode == 1 and "but the payload says 10.0" in out.stdout


def test_a_run_logging_thousands_of_new_names_does_not_widen_the_shared_table(local_root, caplog):
    from runledger.ledger.storage.tables import Tables

    log_runs({"quiet": {0: {"loss": 1.5}}})
    flood = {s: {f"layer_{s}_{i}/norm": float(i) + s / 8 for i in range(2048)} for s in range(3)}
    with caplog.at_level(logging.WARNING, logger="runledger"):
        log_runs({"flood": flood})
    log_runs({"quiet": {1: {"loss": 2.5, "Loss": 3.5}}}, resume=True)

    table = Tables(local_root, mark=False).table("metrics")
    metric_columns = [f.name for f in table.schema().fields if f.name.startswith("metrics/") and f.name != "metrics/"]
    assert len(metric_columns) <= WIDE_COLUMNS_MAX and len(table.schemas()) <= WIDE_COLUMNS_MAX
    past = [r for r in caplog.records if "narrow" in r.getMessage()]
    assert len(past) == 1 and "flood" in past[0].getMessage()  # warned once, in the producer's log
    assert stored_metrics(local_root, "flood") == flood  # every name stored, exactly, past the bound too
    assert stored_metrics(local_root, "quiet") == {0: {"loss": 1.5}, 1: {"loss": 2.5, "Loss": 3.5}}
    name = "layer_2_2047/norm"
    one = "select step, value from metric(?) where run_id = 'flood' and value is not null"
    assert reader(local_root).execute(one, [name]).fetchall() == [(2, flood[2][name])]
    n = reader(local_root).execute("select count(*) from metrics_all where run_id = 'flood'").fetchone()[0]
    assert n == 3 * 2048 > WIDE_COLUMNS_PER_RUN
    assert cli("verify", "--root", str(local_root)).returncode == 0

    def change_narrow(table: pa.Table) -> pa.Table:  # a value kept past the bound, changed
        i = table.column_names.index("metrics/")
        rows = [None if m is None else [(k, v + 1.0 if k == name else v) for k, v in m] for m in table.column(i).to_pylist()]
        return table.set_column(i, "metrics/", pa.array(rows, table.schema.field(i).type))

    rewrite_partition(local_root, "metrics", "flood", lambda r: True, change_narrow)
    out = cli("verify", "--root", str(local_root))
    assert out.returncode == 1 and "flood:main:0:" in out.stdout


@pytest.mark.parametrize("drop", ["loss"])
def test_a_metric_column_deleted_from_a_stored_file_is_named_by_verify(local_root, drop):
    log_runs({"del": {s: {"loss": 1.0 + s, "lr": 0.1} for s in range(3)}})
    assert cli("verify", "--root", str(local_root)).returncode == 0
    rewrite_partition(local_root, "metrics", "del", lambda r: True, lambda t: t.drop_columns([f"metrics/{drop}"]))
    out = cli("verify", "--root", str(local_root))
    assert out.returncode == 1 and "del:main:0:" in out.stdout


def test_a_root_whose_columns_hold_the_raw_names_still_reads_and_verifies(local_root):
    """A file of a root written before names were escaped holds `metrics/Loss`, the raw name."""
    log_runs({"old": {s: {"Loss": 2.0 + s, "café": 1.0} for s in range(2)}})

    def raw(n: str) -> str:
        return "metrics/" + metric_name(n) if n.startswith("metrics/") and n != "metrics/" else n

    rewrite_partition(local_root, "metrics", "old", lambda r: True,
                      lambda t: t.rename_columns([raw(n) for n in t.column_names]))
    assert "metrics/Loss" in read_events(local_root, "metrics", "old", columns=["metrics/Loss"]).column_names
    assert stored_metrics(local_root, "old") == {s: {"Loss": 2.0 + s, "café": 1.0} for s in range(2)}
    assert cli("verify", "--root", str(local_root)).returncode == 0
    log_runs({"old": {2: {"Loss": 4.0, "café": 1.0}}}, resume=True)  # a new file: the escaped names
    logged = {s: {"Loss": 2.0 + s, "café": 1.0} for s in range(3)}
    assert stored_metrics(local_root, "old") == logged
    # compaction merges the old and the new files' columns: one column per name, where verify finds it
    assert compact_partition(partition_dir(local_root, "metrics", "old"), min_files=1) is not None
    assert stored_metrics(local_root, "old") == logged
    assert cli("verify", "--root", str(local_root)).returncode == 0
