"""Provenance and forecast audits, a resumed run through the health checks, and `runledger audit`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from audit_ledger import STEPS, Ledger, write_run
from conftest import cli
from runledger.queries import audit
from runledger.training.schedule import make_schedule, retime

RESUME = {"path": "ckpt/resumed/200", "step": 200, "content_hash": f"{200:064x}"}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("suites") / "ledger"
    led = Ledger(root)
    write_run(led, "clean", forecasts="hit")
    write_run(led, "fc-miss", forecasts="miss")
    # attempt 0 retimes the decay at step 200 and dies at 250; attempt 1 resumes from the step-200
    # checkpoint with a new commit and the retimed schedule, as the worker carries it
    retimed = retime(make_schedule(1e-3, 20, STEPS, 0.05, tokens_per_step=1024), 201, 300)  # as the worker retimed it
    write_run(led, "resumed", last=250, finish=False)
    write_run(led, "resumed", attempt=1, first=201, t_offset=10, retime_at=None, schedule=retimed,
              resumed_from=RESUME, code_commit="def456")
    # the same, but the resumed worker lost the retime: back on the original schedule
    write_run(led, "lost-retime", last=250, finish=False)
    write_run(led, "lost-retime", attempt=1, first=201, t_offset=10, retime_at=None,
              resumed_from=dict(RESUME, path="ckpt/lost-retime/200"))
    # resumed from a checkpoint the ledger never saw
    write_run(led, "orphan", last=150, finish=False)
    write_run(led, "orphan", attempt=1, first=151, t_offset=10, retime_at=None,
              resumed_from={"path": "elsewhere/150", "step": 150, "content_hash": "e" * 64})
    # a fork of the clean run from its step-200 checkpoint
    write_run(led, "fork", first=201, retime_at=None, schedule=retimed,
              parent={"run_id": "clean", "step": 200, "content_hash": f"{200:064x}", "path": "ckpt/clean/200"})
    led.write()
    return root


def by_name(a: audit.Audit) -> dict[str, list[dict]]:
    return {r.name: [dict(zip(r.columns, row)) for row in r.rows] for r in a.results}


def test_the_decision_trail_links_decision_evidence_and_application(root):
    trail = by_name(audit.run_suite(root, "provenance", "clean"))["provenance/decision_trail"]
    assert len(trail) == 1
    d = trail[0]
    assert d["action"] == "set_token_horizon" and d["agent"] == "agent-horizon" and d["status"] == "applied"
    assert json.loads(d["evidence"]) == {"query": "forecast/vs_actual"}
    assert d["decided_at_step"] == 200 and d["applied_at_step"] == 200 and d["applied_by"] == "worker-0"
    after = json.loads(d["after"])  # the retimed schedule, from update 201 on
    assert after["horizon_steps"] == 300 and after["anchor_step"] == 201


def test_mixture_and_sources_are_reported_per_domain(root):
    p = by_name(audit.run_suite(root, "provenance", "clean"))
    mix = {r["domain"]: r for r in p["provenance/data_mixture"]}
    assert set(mix) == {"code", "prose"}
    assert mix["code"]["declared_share"] == 0.5 and mix["code"]["token_share"] == 0.5
    assert mix["code"]["share_minus_declared"] == 0
    sources = p["provenance/data_sources"]
    assert {(s["domain"], s["sha256"][:4], s["bytes"]) for s in sources} == {("code", "aaaa", 100), ("prose", "bbbb", 90)}


def test_each_attempt_shows_its_commit_and_the_checkpoint_it_resumed_from(root):
    p = by_name(audit.run_suite(root, "provenance", "resumed"))
    commits = p["provenance/code_commits"]
    assert [(c["attempt"], c["code_commit"], c["commit_changed"]) for c in commits] == [(0, "abc123", False), (1, "def456", True)]
    lineage = {r["attempt"]: r for r in p["provenance/checkpoint_lineage"]}
    assert lineage[0]["lineage"] == "fresh start"
    assert lineage[1]["start_kind"] == "resume" and lineage[1]["lineage"] == "matches a saved checkpoint"
    assert lineage[1]["saved_by_attempt"] == 0 and lineage[1]["saved_at_step"] == 200
    fork = by_name(audit.run_suite(root, "provenance", "fork"))["provenance/checkpoint_lineage"]
    assert [(r["start_kind"], r["source_run"], r["saved_at_step"], r["lineage"]) for r in fork] == [
        ("fork", "clean", 200, "matches a saved checkpoint")]
    orphan = {r["attempt"]: r for r in by_name(audit.run_suite(root, "provenance", "orphan"))["provenance/checkpoint_lineage"]}
    assert orphan[1]["lineage"] == "checkpoint not in the ledger"


def test_a_resumed_run_is_held_to_its_retimed_schedule(root):
    health = {r["check"]: r for r in audit.run_suite(root, "health", "resumed").rows()}
    assert health["lr_schedule"]["status"] == "ok", health["lr_schedule"]
    assert json.loads(health["lr_schedule"]["evidence"])["steps_checked"] == 450  # 250 + 200 re-done or new
    assert health["config_match"]["status"] == "ok"
    assert health["telemetry_silence"]["status"] == "ok"
    lost = {r["check"]: r for r in audit.run_suite(root, "health", "lost-retime").rows()}["lr_schedule"]
    assert lost["status"] == "fail" and lost["at_step"] == 202, lost  # the retime from 201 on was lost


def test_forecast_vs_actual_at_each_five_percent(root):
    rows = by_name(audit.run_suite(root, "forecast", "fc-miss"))["forecast/vs_actual"]
    assert [round(r["fraction"], 2) for r in rows] == [round(i / 20, 2) for i in range(1, 20)]
    assert all(r["reached"] for r in rows)
    missed = [r for r in rows if not r["inside_band"]]
    assert len(missed) == 1 and round(missed[0]["fraction"], 2) == 0.5 and missed[0]["at_step"] == 200
    assert missed[0]["residual"] == pytest.approx(0.5, abs=0.05)
    clean = by_name(audit.run_suite(root, "forecast", "clean"))["forecast/vs_actual"]
    assert all(r["inside_band"] for r in clean)


def audit_cli(*argv: str) -> tuple[int, str]:
    r = cli(*argv)
    return r.returncode, r.stdout


def test_the_cli_exits_1_when_a_health_check_fails_and_writes_each_format(root):
    code, text = audit_cli("audit", "health", "clean", "--root", str(root))
    assert code == 0 and "lr_schedule" in text and "fail" not in text
    code, text = audit_cli("audit", "health", "fc-miss", "--root", str(root), "--format", "json")
    assert code == 1
    assert {r["check"]: r["status"] for r in json.loads(text)}["forecast_hit"] == "fail"
    code, text = audit_cli("audit", "health", "clean", "--root", str(root), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert code == 0 and list(rows[0]) == list(audit.HEALTH_COLUMNS) and len(rows) == len(audit.query_names("health"))
    code, text = audit_cli("audit", "provenance", "resumed", "--root", str(root), "--format", "json")
    assert code == 0 and set(json.loads(text)) == set(audit.query_names("provenance"))
    code, _ = audit_cli("audit", "forecast", "no-such-run", "--root", str(root))
    assert code == 2


def test_the_checks_are_one_question_per_file_with_a_comment_saying_which(root):
    for suite in audit.SUITES:
        for name in audit.query_names(suite):
            text = (Path(audit.queries.HERE) / f"{name}.sql").read_text()
            assert text.startswith("-- ") and text.splitlines()[0].rstrip().endswith("?") or suite != "health", name


def test_each_query_runs_alone_over_the_plain_views_and_agrees_with_the_runner(root):
    from runledger import queries

    con = queries.connect(root)  # no helpers materialised: the files read the views of views.sql
    for suite in audit.SUITES:
        ran = {r.name: sorted(r.rows, key=repr) for r in audit.run_suite(root, suite).results}
        for name in audit.query_names(suite):
            queries.check_read_only(con, queries.load_query(name))
            alone = sorted(con.execute(queries.load_query(name)).fetchall(), key=repr)
            assert alone == ran[name], name
