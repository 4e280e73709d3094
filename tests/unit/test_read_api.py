"""Reading runs back (runledger.Api over runledger.queries.history, and the dashboard's /api/history): every point
exactly as logged, NaN and infinities included, in pages whose cursor belongs to one run; a bad read is one line."""

from __future__ import annotations

import math

import pytest

import runledger
from runledger.queries import history
from support.audit_ledger import T0, Ledger
from support.ui import client

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

STEPS = 2500


def write_runs(root):
    """Run `a` (two attempts: the second redoes steps 2000..2499 with another loss, and logs `odd` not finite: from
step 2000 on, only its points count), run `b`."""
    led = Ledger(root)
    start = {"config_hash": "c", "token_budget": 100, "schedule": {}}
    led.emit("a", "run_started", {**start, "config": {"lr": 0.1, "layers": 2}, "project": "p", "name": "alpha",
                                  "tags": ["base", "x"]}, 0, T0)
    for k in range(STEPS):
        m = {"train/loss": 1.0 / (k + 1), "Acc": k * 0.25}
        led.emit("a", "metrics", {"metrics": m}, k, T0)
    led.emit("a", "run_started", {**start, "config": {"lr": 0.1, "layers": 2}, "project": "p", "name": "alpha",
                                  "tags": ["base", "x"]}, 2000, T0,
             attempt=1)
    for k in range(2000, STEPS):
        led.emit("a", "metrics", {"metrics": {"train/loss": -float(k)}}, k, T0, attempt=1)
    led.emit("a", "metrics", {"metrics": {"odd": None}, "nonfinite": {"odd": "nan"}}, STEPS, T0, attempt=1)
    led.emit("a", "metrics", {"metrics": {"odd": None}, "nonfinite": {"odd": "-inf"}}, STEPS + 1, T0, attempt=1)
    led.emit("a", "run_finished", {"status": "completed", "summary": {"train/loss": 0.5}}, STEPS, T0, attempt=1)
    led.emit("b", "run_started", {**start, "config": {"lr": 0.2}, "project": "q", "name": "beta"}, 0, T0)
    led.emit("b", "metrics", {"metrics": {"train/loss": 3.0}}, 0, T0)
    led.emit("c", "metrics", {"metrics": {"x": 1.5}}, 7, T0)  # a stream of metrics alone: no run_started
    led.write()


@pytest.fixture
def runs_root(root):
    write_runs(root)
    return root


def test_runs_carry_config_tags_and_summary_and_filter(runs_root):
    api = runledger.Api(root=runs_root)
    assert [r.id for r in api.runs()] == ["a", "b"]
    (a,) = api.runs({"tags": "base"})
    assert (a.name, a.project, a.state, a.attempts) == ("alpha", "p", "finished", 2)
    assert a.config == {"lr": 0.1, "layers": 2} and a.summary == {"train/loss": 0.5} and a.tags == ["base", "x"]
    assert [r.id for r in api.runs({"config.lr": 0.2})] == ["b"] and [r.id for r in api.runs("team/q")] == ["b"]
    assert api.run("beta").id == "b"
    assert api.run("c").history(["x"]).to_pydict() == {"step": [7], "attempt": [0], "time": ["2026-11-01T12:00:00.000000Z"],
                                                       "x": [1.5]}  # (not among the runs that started, read all the same)
    with pytest.raises(runledger.ApiError, match="cannot filter runs by 'colour'"):
        api.runs({"colour": "red"})
    with pytest.raises(runledger.ApiError, match="no run has the id or name 'zeta'"):
        api.run("zeta")


def test_history_is_every_point_exactly_with_the_latest_attempt_per_step(runs_root):
    run = runledger.Api(root=runs_root).run("a")
    t = run.history(["train/loss", "Acc"])
    assert t.column_names == ["step", "attempt", "time", "train/loss", "Acc"]
    assert t.num_rows == STEPS and t.column("step").to_pylist() == list(range(STEPS))
    loss = t.column("train/loss").to_pylist()
    assert loss[:2000] == [1.0 / (k + 1) for k in range(2000)]  # bit for bit: no sampling, no rounding
    assert loss[2000:] == [-float(k) for k in range(2000, STEPS)]  # the resumed attempt's, not the first's
    assert t.column("attempt").to_pylist() == [0] * 2000 + [1] * 500
    first = run.history("train/loss", attempt=0)
    assert first.num_rows == STEPS and first.column("train/loss").to_pylist()[-1] == 1.0 / STEPS
    odd = run.history(["odd"]).column("odd").to_pylist()
    assert math.isnan(odd[0]) and odd[1] == -math.inf  # logged not finite, read back as logged
    window = run.history(["Acc"], steps=(10, 19), format="polars")  # (pandas: format="pandas", where it is installed)
    assert window["step"].to_list() == list(range(10, 20)) and window["Acc"].to_list() == [k * 0.25 for k in range(10, 20)]
    assert set(run.history(steps=range(0, 5)).column_names) == {"step", "attempt", "time", "train/loss", "Acc", "odd"}


def test_pages_put_back_together_are_the_whole_history(runs_root):
    whole, _ = history.history(runs_root, "a", ["train/loss"], attempt=0)
    pages, cursor = [], None
    while True:
        page, cursor = history.history(runs_root, "a", ["train/loss"], attempt=0, after=cursor, limit=999)
        assert page.num_rows <= 999
        pages.append(page)
        if cursor is None:
            break
    assert len(pages) == 3 and sum(p.num_rows for p in pages) == whole.num_rows
    assert [v for p in pages for v in p.column("train/loss").to_pylist()] == whole.column("train/loss").to_pylist()


def test_a_page_of_many_keys_has_fewer_rows(runs_root, monkeypatch):
    monkeypatch.setattr(history, "MAX_PAGE_CELLS", 10)
    page, cursor = history.history(runs_root, "a", ["train/loss", "Acc"], attempt=0, limit=1000)
    assert page.num_rows == 5 and cursor is not None  # 10 values of 2 keys, and the rest on the next pages


def test_a_cursor_of_another_run_or_read_is_refused(runs_root):
    _, cursor = history.history(runs_root, "a", ["train/loss"], limit=10)
    with pytest.raises(history.BadCursor, match="this cursor is of run 'a', not of 'b'"):
        history.history(runs_root, "b", ["train/loss"], after=cursor, limit=10)
    with pytest.raises(history.BadCursor, match="another read"):
        history.history(runs_root, "a", ["train/loss"], attempt=1, after=cursor, limit=10)
    with pytest.raises(history.BadCursor, match="not a history cursor"):
        history.history(runs_root, "a", ["train/loss"], after="eyJub3BlIjoxfQ", limit=10)


@pytest.mark.parametrize("call, message", [
    (lambda r: r.history(["train/los"]), "run 'a' logged no 'train/los'"),
    (lambda r: r.history(["Acc"], format="excel"), "format 'excel' is not one of arrow, pandas, polars"),
    (lambda r: r.history(["Acc"], attempt=-1), "attempt is a whole number >= 0"),
    (lambda r: r.history(["Acc"], steps="all"), "steps is"),
    (lambda r: r.history(["Acc"], source="evals"), "unknown source 'evals'"),
    (lambda r: r.histograms, "not stored yet"),
])
def test_a_bad_read_is_one_line(runs_root, call, message):
    run = runledger.Api(root=runs_root).run("a")
    with pytest.raises(runledger.ApiError, match=message) as err:
        call(run)
    assert "\n" not in str(err.value)


def test_the_dashboard_pages_history_behind_its_read_token(runs_root):
    token = "r" * 24
    page = client(runs_root, "127.0.0.1", read_token=token)
    assert page.get("/api/history", params={"run": "a", "keys": "Acc"}).status_code == 401
    got, cursor, bearer = [], None, {"authorization": f"Bearer {token}"}
    while True:
        r = page.get("/api/history", params={"run": "alpha", "keys": '["Acc"]', "limit": "1000", "attempt": "0",
                                             **({"cursor": cursor} if cursor else {})}, headers=bearer)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["rows"] <= 1000 and body["column_order"] == ["step", "attempt", "time", "Acc"]
        got += body["columns"]["Acc"]
        if not (cursor := body["cursor"]):
            break
    assert got == [k * 0.25 for k in range(STEPS)]
    odd = page.get("/api/history", params={"run": "a", "keys": "odd"}, headers=bearer).json()
    assert odd["columns"]["odd"] == ["NaN", "-Infinity"] and history.from_jsonable(odd["columns"]["odd"])[1] == -math.inf
    _, other = history.history(runs_root, "a", ["train/loss"], limit=10)
    refused = page.get("/api/history", params={"run": "b", "keys": "train/loss", "cursor": other}, headers=bearer)
    assert refused.status_code == 400 and refused.json() == {"error": "this cursor is of run 'a', not of 'b'"}
    too_big = page.get("/api/history", params={"run": "a", "limit": str(history.MAX_PAGE + 1)}, headers=bearer)
    assert too_big.status_code == 400 and "limit must be a whole number" in too_big.json()["error"]
    runs = page.get("/api/history/runs", params={"filters": '{"project": "q"}'}, headers=bearer).json()["runs"]
    assert [r["run_id"] for r in runs] == ["b"] and runs[0]["config"] == {"lr": 0.2}
