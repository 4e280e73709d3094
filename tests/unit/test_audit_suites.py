"""Provenance and forecast audits, a resumed run through the health checks, and `runledger audit`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from runledger.queries import audit
from support.audits import suites_root  # noqa: F401 (fixtures)
from support.processes import cli

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)


def by_name(a: audit.Audit) -> dict[str, list[dict]]:
    return {r.name: [dict(zip(r.columns, row)) for row in r.rows] for r in a.results}


def test_the_decision_trail_links_decision_evidence_and_application(suites_root):
    trail = by_name(audit.run_suite(suites_root, "provenance", "clean"))["provenance/decision_trail"]
    assert len(trail) == 1
    d = trail[0]
    assert d["action"] == "set_token_horizon" and d["agent"] == "agent-horizon" and d["status"] == "applied"
    assert json.loads(d["evidence"]) == {"query": "forecast/vs_actual"}
    assert d["decided_at_step"] == 200 and d["applied_at_step"] == 200 and d["applied_by"] == "worker-0"
    after = json.loads(d["after"])  # the retimed schedule, from update 201 on
    assert after["horizon_steps"] == 300 and after["anchor_step"] == 201


def test_mixture_and_sources_are_reported_per_domain(suites_root):
    p = by_name(audit.run_suite(suites_root, "provenance", "clean"))
    mix = {r["domain"]: r for r in p["provenance/data_mixture"]}
    assert set(mix) == {"code", "prose"}
    assert mix["code"]["declared_share"] == 0.5 and mix["code"]["token_share"] == 0.5
    assert mix["code"]["share_minus_declared"] == 0
    sources = p["provenance/data_sources"]
    assert {(s["domain"], s["sha256"][:4], s["bytes"]) for s in sources} == {("code", "aaaa", 100), ("prose", "bbbb", 90)}


def test_each_attempt_shows_its_commit_and_the_checkpoint_it_resumed_from(suites_root):
    p = by_name(audit.run_suite(suites_root, "provenance", "resumed"))
    commits = p["provenance/code_commits"]
    assert [(c["attempt"], c["code_commit"], c["commit_changed"]) for c in commits] == [(0, "abc123", False), (1, "def456", True)]
    lineage = {r["attempt"]: r for r in p["provenance/checkpoint_lineage"]}
    assert lineage[0]["lineage"] == "fresh start"
    assert lineage[1]["start_kind"] == "resume" and lineage[1]["lineage"] == "matches a saved checkpoint"
    assert lineage[1]["saved_by_attempt"] == 0 and lineage[1]["saved_at_step"] == 200
    fork = by_name(audit.run_suite(suites_root, "provenance", "fork"))["provenance/checkpoint_lineage"]
    assert [(r["start_kind"], r["source_run"], r["saved_at_step"], r["lineage"]) for r in fork] == [
        ("fork", "clean", 200, "matches a saved checkpoint")]
    orphan = {r["attempt"]: r for r in by_name(audit.run_suite(suites_root, "provenance", "orphan"))["provenance/checkpoint_lineage"]}
    assert orphan[1]["lineage"] == "checkpoint not in the ledger"


def test_a_resumed_run_is_held_to_its_retimed_schedule(suites_root):
    health = {r["check"]: r for r in audit.run_suite(suites_root, "health", "resumed").rows()}
    assert health["lr_schedule"]["status"] == "ok", health["lr_schedule"]
    assert json.loads(health["lr_schedule"]["evidence"])["steps_checked"] == 450  # 250 + 200 re-done or new
    assert health["config_match"]["status"] == "ok"
    assert health["telemetry_silence"]["status"] == "ok"
    lost = {r["check"]: r for r in audit.run_suite(suites_root, "health", "lost-retime").rows()}["lr_schedule"]
    assert lost["status"] == "fail" and lost["at_step"] == 202, lost  # the retime from 201 on was lost


def test_forecast_vs_actual_at_each_five_percent(suites_root):
    rows = by_name(audit.run_suite(suites_root, "forecast", "fc-miss"))["forecast/vs_actual"]
    assert [round(r["fraction"], 2) for r in rows] == [round(i / 20, 2) for i in range(1, 20)]
    assert all(r["reached"] for r in rows)
    missed = [r for r in rows if not r["inside_band"]]
    assert len(missed) == 1 and round(missed[0]["fraction"], 2) == 0.5 and missed[0]["at_step"] == 200
    assert missed[0]["residual"] == pytest.approx(0.5, abs=0.05)
    clean = by_name(audit.run_suite(suites_root, "forecast", "clean"))["forecast/vs_actual"]
    assert all(r["inside_band"] for r in clean)


def audit_cli(*argv: str) -> tuple[int, str]:
    r = cli(*argv)
    return r.returncode, r.stdout


def test_the_cli_exits_1_when_a_health_check_fails_and_writes_each_format(suites_root):
    code, text = audit_cli("audit", "health", "clean", "--root", str(suites_root))
    assert code == 0 and "lr_schedule" in text and "fail" not in text
    code, text = audit_cli("audit", "health", "fc-miss", "--root", str(suites_root), "--format", "json")
    assert code == 1
    assert {r["check"]: r["status"] for r in json.loads(text)}["forecast_hit"] == "fail"
    code, text = audit_cli("audit", "health", "clean", "--root", str(suites_root), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert code == 0 and list(rows[0]) == list(audit.HEALTH_COLUMNS) and len(rows) == len(audit.query_names("health"))
    code, text = audit_cli("audit", "provenance", "resumed", "--root", str(suites_root), "--format", "json")
    assert code == 0 and set(json.loads(text)) == set(audit.query_names("provenance"))
    code, _ = audit_cli("audit", "forecast", "no-such-run", "--root", str(suites_root))
    assert code == 2


def test_the_checks_are_one_question_per_file_with_a_comment_saying_which(suites_root):
    for suite in audit.SUITES:
        for name in audit.query_names(suite):
            text = (Path(audit.queries.HERE) / f"{name}.sql").read_text()
            assert text.startswith("-- ") and text.splitlines()[0].rstrip().endswith("?") or suite != "health", name
