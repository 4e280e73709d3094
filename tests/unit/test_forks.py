"""Forks and rewinds (issue 42): a point of a run is named as "RUN?_step=N" or "RUN@STEP"; a fork's `steps`
read its parent's rows up to the fork step and its own after, through a fork of a fork; a rewind supersedes
the run's earlier steps after its step and leaves a fork made before it as it was; the trainer's fork and
`init(fork_from=)` name the same parent; bad points are one-line refusals; the fork audit passes a fork
that matches its parent and fails one 0.05 nats worse, naming the window.

The ledgers are written by the real writer (tests/support/audit_ledger.Ledger), no server.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from runledger import queries
from runledger.queries import audit
from runledger.queries.forks import ForkRefused, Point, checkpoint_point, fork_point, parse_point, start_of
from support.audit_ledger import T0, Ledger

START = {"config": {}, "config_hash": "0" * 64}


def loss_at(k: int) -> float:
    return 3.0 - 0.01 * k


def write_steps(led: Ledger, run_id: str, first: int, last: int, *, attempt: int = 0, worse: float = 0.0,
          parent: dict | None = None, rewind: dict | None = None, checkpoint_at: int | None = None,
          drops: float = 0.01) -> None:
    """One attempt of a run: run_started (with its parent or rewind point), a step (and drops) per step."""
    start = {**START, **({"parent": parent} if parent else {}), **({"rewind": rewind} if rewind else {})}
    at = T0 + timedelta(seconds=first)
    led.emit(run_id, "run_started", start, first - 1 if first else None, at, attempt=attempt)
    for k in range(first, last + 1):
        at = T0 + timedelta(seconds=k)
        led.emit(run_id, "step", {"loss": loss_at(k) + worse, "grad_norm": 0.3, "lr": 1e-3, "tokens": 1024,
                                  "step_time_s": 1.0, "mfu": 0.4}, k, at, attempt=attempt)
        led.emit(run_id, "drops", {"dispatch": "capacity", "assignments": 1000, "dropped": int(drops * 1000),
                                   "drop_fraction": drops}, k, at, attempt=attempt)
        if k == checkpoint_at:
            led.emit(run_id, "checkpoint", {"path": f"/ckpt/{run_id}/{k}", "bytes": 10, "content_hash": "c" * 64},
                     k, at, attempt=attempt)
    led.write()


def steps_of(root, run_id: str) -> list[tuple]:
    con = queries.connect(root)
    return con.execute("select step, from_run, attempt, loss from steps where run_id = ? order by step", [run_id]).fetchall()


@pytest.mark.parametrize("text, point", [
    ("main?_step=120", Point("main", 120)),
    ("main@120", Point("main", 120)),
    (" run-2_b@0 ", Point("run-2_b", 0)),
])
def test_a_point_is_named_as_w_and_bs_run_step_or_as_run_at_step(text, point):
    assert parse_point(text) == point


@pytest.mark.parametrize("text", ["main", "main?_step=", "main@", "Main@3", "main@-1", "main?step=3", "main@3@4",
                                  "main@1e3", "@3", "main\n@3", None, 3, "main@" + "9" * 20])
def test_a_bad_point_is_one_line_refused(text):
    with pytest.raises(ForkRefused) as err:
        parse_point(text)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


@pytest.mark.parametrize("given, run_id, resume, says", [
    ({"fork_from": "a@1", "resume_from": "a@1"}, None, None, "exclude each other"),
    ({"fork_from": "a@1"}, None, True, "starts a new run"),
    ({"fork_from": "a@1"}, "a", None, "cannot fork from itself"),
    ({"resume_from": "a@1"}, "b", None, "rewinds run 'a', not id='b'"),
])
def test_init_refuses_a_fork_or_rewind_that_contradicts_its_other_arguments(tmp_path, given, run_id, resume, says):
    with pytest.raises(ForkRefused, match=says):
        start_of(tmp_path, given, run_id, resume, resolve=False)


def test_a_rewind_names_its_run_and_goes_on_with_it(tmp_path):
    how, point, run_id, resume = start_of(tmp_path, {"resume_from": "a?_step=7"}, None, None, resolve=False)
    assert (how, point, run_id, resume) == ("rewind", {"run_id": "a", "step": 7}, "a", "must")
    assert start_of(tmp_path, {"fork_from": "a@7"}, None, None, resolve=False)[:3] == ("parent", {"run_id": "a", "step": 7}, None)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """main (steps 1..60, a checkpoint at 30); cut, a fork of main at 30 (steps 31..60); cut2, a fork of cut at
    45; then main rewound to 40 as attempt 1 (steps 41..45)."""
    root = tmp_path_factory.mktemp("forks") / "ledger"
    led = Ledger(root)
    write_steps(led, "main", 1, 60, checkpoint_at=30)
    at30 = fork_point(root, "main", 30)
    write_steps(led, "cut", 31, 60, parent=at30)
    write_steps(led, "cut2", 46, 70, parent=fork_point(root, "cut", 45))
    before = steps_of(root, "cut")
    write_steps(led, "main", 41, 45, attempt=1, rewind=fork_point(root, "main", 40, rewind=True))
    return root, at30, before


def test_a_forks_steps_read_its_parents_up_to_the_fork_step_and_its_own_after(family):
    root, _, _ = family
    rows = steps_of(root, "cut")
    assert [r[0] for r in rows] == list(range(1, 61))  # one row per step, none missing, none twice
    assert {r[1] for r in rows if r[0] <= 30} == {"main"} and {r[1] for r in rows if r[0] > 30} == {"cut"}
    assert all(r[3] == pytest.approx(loss_at(r[0])) for r in rows)
    # the fork's own rows are its steps_all, untouched
    con = queries.connect(root)
    assert con.execute("select count(*), min(step) from steps_all where run_id = 'cut'").fetchone() == (30, 31)


def test_a_fork_of_a_fork_reads_through_to_the_grandparent(family):
    rows = steps_of(family[0], "cut2")
    assert [r[0] for r in rows] == list(range(1, 71))
    assert [r[1] for r in rows] == ["main"] * 30 + ["cut"] * 15 + ["cut2"] * 25


def test_a_rewind_supersedes_the_runs_later_steps_and_leaves_an_earlier_fork_as_it_was(family):
    root, _, before = family
    rows = steps_of(root, "main")
    assert [(r[0], r[2]) for r in rows] == [(k, 0) for k in range(1, 41)] + [(k, 1) for k in range(41, 46)]
    assert steps_of(root, "cut") == before  # the fork named main's attempt 0: its history stays
    con = queries.connect(root)  # every row is still stored: the rewind only changes what counts
    assert con.execute("select count(*) from steps_all where run_id = 'main'").fetchone()[0] == 65
    assert con.execute("select how, parent_run, parent_attempt, fork_step from forks order by run_id, attempt").fetchall() == [
        ("fork", "main", 0, 30), ("fork", "cut", 0, 45), ("rewind", "main", 0, 40)]


def test_the_fork_point_names_the_parents_attempt_step_and_ledger_position(family):
    root, at30, _ = family
    con = queries.connect(root)
    event_id, digest, stream_seq = con.execute(
        "select event_id, hash, stream_seq from steps_all where run_id = 'main' and step = 30").fetchone()
    assert at30 == {"run_id": "main", "step": 30, "attempt": 0, "stream_seq": stream_seq, "event_id": event_id,
                    "hash": digest, "path": "/ckpt/main/30", "content_hash": "c" * 64}
    stored = json.loads(con.execute("select parent from runs where run_id = 'cut'").fetchone()[0])
    assert stored == at30


def test_the_trainers_fork_and_init_fork_from_name_the_same_parent(family):
    """`runledger train --fork-from main@30` restores main's checkpoint at 30 and records
    checkpoint_point(...); init(fork_from="main?_step=30") records fork_point(...): the same dict."""
    root, at30, _ = family
    assert checkpoint_point(root, "main", 30, "/ckpt/main/30", "c" * 64) == at30
    assert fork_point(root, *parse_point("main@30").__dict__.values()) == fork_point(root, "main", 30)


@pytest.mark.parametrize("run_id, step, rewind, says", [
    ("nope", 3, False, "no run 'nope'"),
    ("main", 46, False, "steps up to 45: step 46 is past its last"),  # (main was rewound: 46..60 no longer count)
    ("cut2", 71, False, "steps up to 70: step 71 is past its last"),  # a fork's future
    ("cut", 20, True, "forked from 'main' at step 30: rewind it to a step >= 30"),
])
def test_a_point_the_ledger_does_not_hold_is_one_line_refused(family, run_id, step, rewind, says):
    with pytest.raises(ForkRefused, match=says) as err:
        fork_point(family[0], run_id, step, rewind=rewind)
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def cutover(tmp_path_factory):
    """main (1..80) and two forks of it at 40: `same`, the same losses; `worse`, 0.05 nats worse, more drops."""
    root = tmp_path_factory.mktemp("cutover") / "ledger"
    led = Ledger(root)
    write_steps(led, "main", 1, 80)
    write_steps(led, "same", 41, 80, parent=fork_point(root, "main", 40))
    write_steps(led, "worse", 41, 80, parent=fork_point(root, "main", 40), worse=0.05, drops=0.03)
    return root


def checks(root, run_id: str) -> dict[str, dict]:
    result = audit.run_suite(root, "fork", run_id)
    return {r["check"]: r for r in result.rows()}, result.failed


def test_the_fork_audit_passes_a_fork_that_matches_its_parent(cutover):
    rows, failed = checks(cutover, "same")
    assert not failed
    assert rows["fork_loss"]["status"] == "ok" and rows["fork_loss"]["value"] == pytest.approx(0.0, abs=1e-12)
    assert rows["fork_mfu"]["status"] == "ok" and rows["fork_drop_fraction"]["status"] == "ok"
    assert {"fork_metric grad_norm", "fork_metric lr", "fork_metric step_time_s"} <= set(rows)


def test_the_fork_audit_fails_a_fork_whose_loss_is_worse_naming_the_window(cutover):
    rows, failed = checks(cutover, "worse")
    assert failed
    loss = rows["fork_loss"]
    assert loss["status"] == "fail" and loss["value"] == pytest.approx(0.05) and loss["threshold"] == 0.02
    evidence = json.loads(loss["evidence"])
    assert evidence["window"] == "steps 41..80" and evidence["steps"] == 40 and evidence["parent"] == "main"
    assert rows["fork_drop_fraction"]["status"] == "warn" and rows["fork_drop_fraction"]["value"] == pytest.approx(0.02)
    assert "steps 41..80" in audit.format_audit(audit.run_suite(cutover, "fork", "worse"), "table")


def test_the_fork_audits_window_is_the_last_fork_window_steps(tmp_path):
    root = tmp_path / "ledger"
    led = Ledger(root)
    write_steps(led, "main", 1, 80)
    start = {**START, "parent": fork_point(root, "main", 40), "thresholds": {"fork_window_steps": 10}}
    led.emit("tail", "run_started", start, 40, T0, attempt=0)
    for k in range(41, 81):  # worse only in its first 30 steps: the last 10 match
        led.emit("tail", "step", {"loss": loss_at(k) + (0.05 if k <= 70 else 0.0), "grad_norm": 0.3, "lr": 1e-3,
                                  "tokens": 1024, "step_time_s": 1.0}, k, T0 + timedelta(seconds=k))
    led.write()
    rows, failed = checks(root, "tail")
    assert not failed and json.loads(rows["fork_loss"]["evidence"])["window"] == "steps 71..80"


def test_a_run_that_is_no_fork_is_skipped_by_the_fork_audit(cutover):
    rows, failed = checks(cutover, "main")
    assert not failed and {r["status"] for r in rows.values()} == {"skip"}


def test_the_run_page_of_a_fork_names_its_parent_and_fork_step(family):
    """The dashboard's run info (runledger.ui.run.run_info): the page draws the parent's charts beside the
    fork's, the fork step marked, and lists each attempt's parent or rewind point."""
    from runledger.ui.data import Reader

    reader = Reader(family[0], threads=1)
    try:
        info = reader.run_info("cut2")
        assert info["fork"] == {"parent": "cut", "step": 45, "attempt": 0}
        assert json.loads(info["attempts"][0]["parent"])["event_id"].startswith("cut:")
        assert reader.run_info("main")["fork"] is None
        assert json.loads(reader.run_info("main")["attempts"][1]["rewind"])["step"] == 40
    finally:
        reader.close()


def test_checkpoint_lineage_names_a_forks_checkpoint_a_rewind_and_a_history_only_fork(family):
    rows = {(r["run_id"], r["attempt"]): r for r in audit.run_suite(family[0], "provenance").rows()
            if "start_kind" in r}
    assert (rows[("cut", 0)]["start_kind"], rows[("cut", 0)]["lineage"]) == ("fork", "matches a saved checkpoint")
    assert rows[("cut", 0)]["saved_at_step"] == 30
    assert (rows[("cut2", 0)]["start_kind"], rows[("cut2", 0)]["lineage"]) == ("fork", "no checkpoint named (the history only)")
    assert rows[("main", 1)]["start_kind"] == "rewind" and rows[("main", 1)]["from_step"] == 40
    assert rows[("main", 1)]["lineage"] == "matches a saved checkpoint"  # (main's checkpoint at 30, before step 40)


def test_train_fork_from_takes_both_forms_of_a_point():
    from runledger.tools import checks
    from runledger.tools.train import fork_point as fork_arg

    assert fork_arg("main@7") == fork_arg("main?_step=7") == "main@7"
    for bad in ("main", "main?_step=x", "bad\nname@3"):
        with pytest.raises(checks.Bad):
            fork_arg(bad)


def test_the_dashboard_shows_the_fork_audit_of_a_fork(cutover, tmp_path, monkeypatch):
    from runledger.ui.data import Reader

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reader = Reader(cutover, threads=1)
    try:
        answer = reader.audit_answer("worse", "fork")
        rows = {row[1]: row for r in answer["results"] for row in r["rows"]}
        assert rows["fork_loss"][2] == "fail" and "steps 41..80" in rows["fork_loss"][6]
    finally:
        reader.close()
