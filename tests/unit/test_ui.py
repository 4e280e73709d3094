"""The dashboard (`runledger ui`): its access rules and its downsampling on a ledger written by the real
writer, then the whole thing in Debian's chromium: a real nats-server, a real ledger process, the UI
served by `runledger ui` on a non-loopback address with a token, and an Emitter logging while the page
is open. One browser and one server for the module.

`RUNLEDGER_UI_SCREENSHOT=docs/ui.png pytest tests/{unit,integration,e2e}/test_ui.py -k charts` also keeps the run page's
screenshot there (the README's first screen).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from runledger.ui.access import configure
from support.audit_ledger import T0, Ledger
from support.runs import RUN, Producer, Stream, run_started, step_payload
from support.ui import client

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

TOKEN, READ_TOKEN = "write-token-0123456789abcdef", "read-token-0123456789abcdef"


# ------------------------------------------------------------------------------------ unit: access rules
@pytest.fixture
def small_root(tmp_path) -> Path:
    """Two runs written by the real writer: `spiky` (3,000 steps, one spike, two attempts) and `flat`."""
    led = Ledger(tmp_path / "root")
    for attempt, (first, last) in enumerate([(1, 1500), (1001, 2500)]):
        led.emit("spiky", "run_started", {"config": {"lr": 1e-3, "layers": 2 + attempt}, "config_hash": "0" * 64,
                                          "tags": ["ui", "spike"]}, first - 1, T0, attempt=attempt)
        for k in range(first, last + 1):
            loss = 50.0 if (attempt == 1 and k == 1777) else 3.0 - k * 1e-4
            led.emit("spiky", "step", {"loss": loss, "grad_norm": 1.0, "lr": 1e-3, "tokens": 10, "step_time_s": 1.0},
                     k, T0 + timedelta(seconds=k), attempt=attempt)
    led.emit("flat", "run_started", {"config": {"lr": 1e-3, "layers": 4}, "config_hash": "0" * 64}, 0, T0)
    led.emit("flat", "metrics", {"metrics": {"train/loss": 2.5, "acc": 0.5}}, 1, T0)
    led.write()
    return tmp_path / "root"


def test_a_non_loopback_ui_refuses_every_request_without_its_token(small_root):
    with pytest.raises(ValueError, match="not loopback"):
        configure("0.0.0.0")
    with client(small_root, "0.0.0.0", token=TOKEN, read_token=READ_TOKEN) as c:
        for path in ("/api/runs", "/api/run/spiky", "/api/run/spiky/series?source=step&keys=loss", "/api/live",
                     "/api/sql?q=select%201", "/api/run/spiky/audit/health", "/api/nowhere"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers={"authorization": "Bearer wrong-token-0123456789"}).status_code == 401, path
        assert c.post("/api/decide", json={}).status_code == 401
        ok = c.get("/api/runs", headers={"authorization": f"Bearer {READ_TOKEN}"})
        assert ok.status_code == 200 and {r["run_id"] for r in ok.json()["runs"]} == {"spiky", "flat"}
        assert c.get("/api/runs", headers={"x-runledger-token": READ_TOKEN}).status_code == 200
        # the page and its code hold no data; the page takes ?token= itself (no cookie is set)
        for path in ("/", f"/?token={TOKEN}", "/static/app.js", "/static/uPlot.iife.min.js"):
            page = c.get(path, follow_redirects=False)
            assert page.status_code == 200 and "set-cookie" not in page.headers, path
        assert c.get("/api/runs").status_code == 401


def test_approve_and_reject_need_the_read_write_token_in_a_header(small_root):
    with client(small_root, "0.0.0.0", token=TOKEN, read_token=READ_TOKEN) as c:
        body = {"run": "spiky", "decision_id": "nope", "action": "approve", "by": "ada"}
        refused = c.post("/api/decide", json=body, headers={"x-runledger-token": READ_TOKEN})
        assert refused.status_code == 403 and "read-only" in refused.text
        assert c.post("/api/decide", json=body).status_code == 401  # no token
        assert c.post("/api/decide", json=body, headers={"x-runledger-token": "forged-0123456789abcdef"}).status_code == 401
        writer = {"x-runledger-token": TOKEN}
        assert c.post("/api/decide", json=body, headers={**writer, "origin": "http://evil.example"}).status_code == 403
        # past the guards: refused for what it is (no NATS here, and no such decision)
        assert c.post("/api/decide", json=body, headers=writer).status_code in (409, 503)


def test_a_loopback_ui_answers_only_to_a_loopback_host_and_still_needs_a_token_to_decide(small_root):
    with client(small_root, "127.0.0.1") as c:
        assert c.get("/api/runs").status_code == 200
        assert c.get("/api/runs", headers={"host": "evil.example:8765"}).status_code == 403  # DNS rebinding
        assert c.post("/api/decide", json={}).status_code in (401, 403)


def test_the_runs_list_filters_by_name_tag_status_and_config_key(small_root):
    with client(small_root, "127.0.0.1") as c:
        ids = lambda q: [r["run_id"] for r in c.get(f"/api/runs?{q}").json()["runs"]]  # noqa: E731
        assert sorted(ids("")) == ["flat", "spiky"]
        assert ids("name=PIK") == ["spiky"] and ids("tag=spike") == ["spiky"] and ids("tag=none") == []
        assert ids("config=layers%3D4") == ["flat"] and ids("config=lr%3D0.001") in (["spiky", "flat"], ["flat", "spiky"])
        assert ids("status=silent") and ids("status=completed") == []  # (written long ago, never finished)
        spiky = next(r for r in c.get("/api/runs").json()["runs"] if r["run_id"] == "spiky")
        assert spiky["attempts"] == 2 and spiky["last_step"] == 2500 and spiky["tags"] == ["ui", "spike"]
        assert c.get("/api/runs?config=bad%20key%3D1").status_code == 400


def test_downsampling_keeps_every_spike_and_is_exact_once_zoomed_in(small_root):
    with client(small_root, "127.0.0.1") as c:
        got = c.get("/api/run/spiky/series?source=step&keys=loss&px=100").json()
        attempts = got["keys"]["loss"]
        assert set(attempts) == {"0", "1"}  # attempts drawn as attempts, not mixed
        xs, ys = attempts["1"]
        assert 50.0 in ys and xs[ys.index(50.0)] == 1777  # the one spike among 1,500 steps
        assert len(xs) <= 4 * 101 and len(attempts["0"][0]) <= 4 * 101
        zoom = c.get("/api/run/spiky/series?source=step&keys=loss&px=100&x0=1750&x1=1799").json()["keys"]["loss"]
        assert zoom["1"][0] == list(range(1750, 1800)) and "0" not in zoom
        free = c.get("/api/run/flat/series?source=metrics&keys=train/loss,acc").json()["keys"]
        assert free["train/loss"]["0"] == [[1], [2.5]] and free["acc"]["0"] == [[1], [0.5]]
        diff = c.get("/api/compare?runs=spiky,flat&key=loss").json()["diff"]
        assert [d["key"] for d in diff] == ["layers"]  # only the keys that differ
        assert c.get("/api/sql?q=delete%20from%20steps").status_code == 400  # the guard of `runledger sql`


def test_the_health_counts_of_many_runs_come_in_one_pass_equal_to_each_runs_checklist(small_root):
    with client(small_root, "127.0.0.1") as c:
        got = c.get("/api/health?runs=spiky,flat,nosuchrun").json()["health"]
        assert sorted(got) == ["flat", "spiky"]
        for run in ("spiky", "flat"):
            counts = {"ok": 0, "warn": 0, "fail": 0, "skip": 0}
            for result in c.get(f"/api/run/{run}/audit/health").json()["results"]:
                for row in result["rows"]:
                    counts[row[2]] += 1
            assert got[run] == counts and sum(counts.values()) > 0
        assert c.get("/api/health?runs=bad%20name").status_code == 400


def test_live_points_stop_at_the_ledgers_position_so_a_kind_readable_later_is_not_skipped(tmp_path):
    """One commit makes its kinds' tables readable one after another: a page's live cursor that moved to
    the greatest seq it read (a step) would skip an earlier event of a kind made readable after it (a
    metric). The cursor is the ledger's position, written once the whole commit is readable."""
    from runledger.ledger.storage import positions, store
    from runledger.ui.data import Reader

    root = tmp_path / "ledger"
    s, w = Stream(), Producer(RUN, "worker-0", 0)
    s.emit(w, "run_started", run_started(), 0)
    s.emit(w, "step", step_payload(5.0), 0)
    s.emit(w, "metrics", {"metrics": {"acc": 0.1}}, 0)  # stream seq 3
    s.emit(w, "step", step_payload(4.9), 1)  # stream seq 4
    store.write_events(root, s.rows[:2])
    positions.write_position(root, 2)
    reader = Reader(root)
    first = reader.new_points(RUN, 0)
    assert first["seq"] == 2 and first["step"]["loss"] == {"0": ([0], [5.0])}
    store.write_events(root, [s.rows[3]])  # the step's table is readable, the metric's not yet
    reader.refresh()
    assert reader.new_points(RUN, 2) == {"seq": 2, "kinds": []}
    store.write_events(root, [s.rows[2]])
    positions.write_position(root, 4)
    reader.refresh()
    news = reader.new_points(RUN, 2)
    assert news["seq"] == 4 and news["metrics"]["acc"] == {"0": ([0], [0.1])} and news["step"]["loss"] == {"0": ([1], [4.9])}
    reader.close()


def test_a_run_page_takes_a_name_one_run_has_and_lists_the_runs_a_shared_name_names(tmp_path):
    """The dashboard finds a run by its name as the CLI does (`runledger.queries.names.resolve_run`)."""
    led = Ledger(tmp_path / "root")
    for run_id, name in (("twin-aaaa", "twin"), ("twin-bbbb", "twin"), ("solo-cccc", "solo"), ("old", None)):
        started = {"config": {}, "config_hash": "0" * 64, "project": "p", **({"name": name} if name else {})}
        led.emit(run_id, "run_started", started, 0, T0)
        led.emit(run_id, "metrics", {"metrics": {"loss": 1.0}}, 1, T0)
    led.write()
    with client(tmp_path / "root", "127.0.0.1") as c:
        assert c.get("/api/run/solo").json()["run_id"] == "solo-cccc"
        assert c.get("/api/run/twin-aaaa").json()["run_id"] == "twin-aaaa"  # an id is one run
        assert c.get("/api/run/old").json()["run_id"] == "old"  # no name stored: named by its id
        assert c.get("/api/run/solo/series?source=metrics&keys=loss").status_code == 200
        shared = c.get("/api/run/twin")
        assert shared.status_code == 400
        assert "ambiguous" in shared.json()["error"] and "twin-aaaa" in shared.json()["error"] and "twin-bbbb" in shared.json()["error"]


@pytest.fixture
def plain_root(tmp_path) -> Path:
    """A loop's run through `runledger.log` (train/, val/ against `epoch` by define_metric, a layer's grad norm)
    and a run that sent one metric and nothing else."""
    led = Ledger(tmp_path / "root")
    led.emit("mlp", "run_started", {"config": {"lr": 0.1}, "config_hash": "0" * 64}, 0, T0)
    led.emit("mlp", "config", {"config": {"_wandb": {"define_metric": {"val/*": {"step_metric": "epoch"},
                                                                       "train/acc": {"step_metric": "nowhere"}}}}}, 0, T0)
    for k in range(1, 21):
        row = {"train/loss": 2 - 0.05 * k, "train/acc": 0.5, "layers/0/grad_norm": 3.0}
        if k % 5 == 0:
            row.update({"val/loss": 2 - 0.04 * k, "epoch": k / 5})
        led.emit("mlp", "metrics", {"metrics": row}, k, T0 + timedelta(seconds=2 * k))
    led.emit("bare", "metrics", {"metrics": {"acc": 0.5}}, 1, T0)
    led.write()
    return tmp_path / "root"


def test_a_define_metric_step_metric_and_the_pages_x_choice_set_the_x_of_the_points(plain_root):
    with client(plain_root, "127.0.0.1") as c:
        info = c.get("/api/run/mlp").json()
        assert info["step_metrics"] == {"val/loss": "epoch"}  # (train/acc's step metric was never logged: its step)
        assert "metrics" in info["kinds"] and "drops" not in info["kinds"]
        series = lambda q: c.get(f"/api/run/mlp/series?source=metrics&keys=val/loss&{q}").json()["keys"]["val/loss"]["0"]  # noqa: E731
        assert series("") == [[5, 10, 15, 20], [1.8, 1.6, 1.4, 1.2]]
        assert series("x=metric:epoch") == [[1.0, 2.0, 3.0, 4.0], [1.8, 1.6, 1.4, 1.2]]
        assert series("x=rel")[0] == [10.0, 20.0, 30.0, 40.0]  # seconds since the run started
        assert series("x=time")[0][0] == (T0 + timedelta(seconds=10)).timestamp()
        assert series("x=metric:epoch&x0=2&x1=3") == [[2.0, 3.0], [1.6, 1.4]]  # zoomed on the step metric
        for bad in ("x=tokens", "x=metric:nowhere", "x=metric:epoch%22", "x=wall"):  # no tokens_per_step; not logged
            assert c.get(f"/api/run/mlp/series?source=metrics&keys=val/loss&{bad}").status_code == 400, bad
        assert c.get("/api/run/mlp/series?source=step&keys=loss&x=metric:epoch").status_code == 400


def test_the_checklist_and_the_health_counts_hold_only_the_checks_whose_inputs_the_run_logged(plain_root):
    from runledger.ui.health import CHECK_INPUTS

    with client(plain_root, "127.0.0.1") as c:
        audit = c.get("/api/run/mlp/audit/health").json()
        listed = {row[1] for r in audit["results"] for row in r["rows"]}
        assert listed == {"config_match", "telemetry_silence", "skipped_steps", "loss_floor", "loss_decreasing", "eval_decreasing",
                          # issue 43's that read a loss, the steps or a run_started
                          "loss_spike", "nonfinite_loss", "still_initializing", "telemetry_gone", "run_down",
                          "resume_matches", "checkpoints_advancing", "attempt_started", "compute_thresholds"}
        left = {n["check"]: n["missing"] for n in audit["not_applicable"]}
        assert set(left) | listed == set(CHECK_INPUTS) and not set(left) & listed
        assert left["grad_norm_max"] == ["grad_norm"] and left["drop_fraction"] == ["token drops"]  # (layers/0/grad_norm is not one)
        counts = c.get("/api/health?runs=mlp,bare").json()["health"]
        assert sum(counts["mlp"].values()) == len(listed)  # the runs page counts the same checks
        bare = c.get("/api/run/bare/audit/health").json()
        assert bare["results"] == [] and len(bare["not_applicable"]) == len(CHECK_INPUTS)
        assert counts["bare"] == {"ok": 0, "warn": 0, "fail": 0, "skip": 0}


def test_a_run_of_more_names_than_columns_has_a_chart_for_each_and_their_live_points(tmp_path):
    """A run's names past the table's bound on columns (in the MAP column) are charted like the others."""
    from runledger.ledger.contract.columns import WIDE_COLUMNS_PER_RUN
    from runledger.ledger.storage import positions
    from runledger.ui.data import Reader

    names = [f"layers/{i:03d}/grad_norm" for i in range(WIDE_COLUMNS_PER_RUN + 36)]
    led = Ledger(tmp_path / "root")
    led.emit("wide", "run_started", {"config": {}, "config_hash": "0" * 64}, 0, T0)
    for k in range(1, 4):
        led.emit("wide", "metrics", {"metrics": {n: float(k + i) for i, n in enumerate(names)}}, k, T0)
    led.write()
    positions.write_position(tmp_path / "root", 4)
    reader = Reader(tmp_path / "root")
    try:
        assert reader.run_info("wide")["keys"]["metrics"] == names  # (the first 64 as columns, the rest in the MAP)
        last, past = names[-1], names[WIDE_COLUMNS_PER_RUN]
        got = reader.series("wide", "metrics", [names[0], past, last], 100)["keys"]
        assert got[past]["0"] == ([1, 2, 3], [65.0, 66.0, 67.0]) and got[last]["0"] == ([1, 2, 3], [100.0, 101.0, 102.0])
        assert reader.series("wide", "metrics", [last], 100, xaxis=f"metric:{past}")["keys"][last]["0"][0] == [65.0, 66.0, 67.0]
        live = reader.new_points("wide", 1)["metrics"]
        assert live[last]["0"] == ([1, 2, 3], [100.0, 101.0, 102.0]) and live[names[0]]["0"] == ([1, 2, 3], [1.0, 2.0, 3.0])
    finally:
        reader.close()


def test_a_run_page_lists_its_open_alerts_with_who_acknowledged_them_and_ack_needs_the_write_token(tmp_path):
    """The page's open alerts, each with its latest acknowledgement (an `alert_ack` from the dashboard,
    producer `ui`); POST /api/ack is guarded as approve and reject are, and refuses an alert the run has not."""
    led = Ledger(tmp_path / "root")
    led.emit("r1", "run_started", {"config": {}, "config_hash": "0" * 64}, 0, T0)
    for i, sev in enumerate(("warn", "fail")):
        led.emit("r1", "alert", {"alert_id": f"a{i}", "agent": "agent-x", "rule": f"rule{i}", "severity": sev,
                                 "message": f"m{i}"}, i, T0 + timedelta(seconds=i), producer="agent-x")
    led.emit("r1", "alert_ack", {"alert_id": "a1", "by": "ada", "via": "dashboard"}, None,
             T0 + timedelta(seconds=5), producer="ui")
    led.write()
    with client(tmp_path / "root", "0.0.0.0", token=TOKEN, read_token=READ_TOKEN) as c:
        reader_ = {"x-runledger-token": READ_TOKEN}
        alerts = c.get("/api/run/r1", headers=reader_).json()["alerts"]
        assert [(a["alert_id"], a["severity"], a["acked_by"]) for a in alerts] == [("a1", "fail", "ada"), ("a0", "warn", None)]
        body = {"run": "r1", "alert_id": "a0", "by": "ada"}
        assert c.post("/api/ack", json=body).status_code == 401
        assert c.post("/api/ack", json=body, headers=reader_).status_code == 403
        writer = {"x-runledger-token": TOKEN}
        assert c.post("/api/ack", json=body, headers={**writer, "origin": "http://evil.example"}).status_code == 403
        assert c.post("/api/ack", json={**body, "alert_id": "nope"}, headers=writer).status_code == 404
        assert c.post("/api/ack", json={**body, "by": "<b>x</b>"}, headers=writer).status_code == 400
        assert c.post("/api/ack", json=body, headers=writer).status_code == 503  # past the guards: no NATS here
