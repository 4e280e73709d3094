"""The dashboard's compare view and runs table, server side, on ledgers written by the real writer: the config
with every config.update applied (the runs page's rows, ui/runs.sql and the `runs` view's config_final agree),
the metrics compare opens on, the runs table's metric columns (each run's last value) and display names."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from runledger import queries
from runledger.ui.compare import default_metrics, opened_on
from runledger.ui.configs import labels
from support.audit_ledger import T0, Ledger
from support.ui import client

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

STEPS = {"r-a": 3000, "r-b": 600, "r-c": 1500}


@pytest.fixture
def updated_root(tmp_path):
    """Three runs that set `steps` by config.update after their start (r-c twice, then resumed with a start
    that sets it back, then an update again), and a run imported from MLflow (its source name in config._import)."""
    led = Ledger(tmp_path / "root")
    for i, (run, steps) in enumerate(STEPS.items()):
        led.emit(run, "run_started", {"config": {"lr": 0.1, "steps": 100, "model": {"width": 64}}, "config_hash": "0" * 64,
                                      "name": f"name-{run}", "group": "sweep", "job_type": "train"}, 0, T0)
        for k in range(1, 21):
            led.emit(run, "metrics", {"metrics": {"train/loss": 3.0 - 0.1 * k - i, "train/acc": 0.01 * k, "val/loss": 2.0}},
                     k, T0 + timedelta(seconds=k))
        led.emit(run, "config", {"config": {"steps": steps if run != "r-c" else 1}}, 10, T0 + timedelta(seconds=10))
    led.emit("r-c", "config", {"config": {"steps": 7, "seed": 3}}, 12, T0 + timedelta(seconds=12))
    led.emit("r-c", "run_started", {"config": {"lr": 0.1, "steps": 100}, "config_hash": "0" * 64}, 15,
             T0 + timedelta(seconds=15), attempt=1)  # a resumed attempt: its start sets steps back to 100
    for k in range(15, 26):  # (the resumed attempt logs again from step 15: its values are the last)
        led.emit("r-c", "metrics", {"metrics": {"train/loss": 0.5, "train/acc": 0.9}}, k, T0 + timedelta(seconds=20 + k), attempt=1)
    led.emit("r-c", "config", {"config": {"steps": 1500}}, 16, T0 + timedelta(seconds=40), attempt=1)
    led.emit("mlflow-d3f07", "run_started", {"config": {"lr": 0.2, "_import": {"source": "mlflow", "source_run_id": "d3f07",
                                                                                 "uri": "file:///m", "run_name": "bright-owl"}},
                                             "config_hash": "0" * 64, "tags": ["imported"]}, None, T0)
    led.emit("mlflow-d3f07", "metrics", {"metrics": {"train/loss": 9.0, "step_only_here": 1.0}}, 3, T0)
    led.write()
    return tmp_path / "root"


def test_the_config_is_init_s_with_every_config_update_applied_the_same_in_python_ui_sql_and_the_runs_view(updated_root):
    from runledger.ui.data import Reader
    from runledger.ui.snapshot import load

    reader = Reader(updated_root, threads=1)
    try:
        rows = reader.summaries()
        want = {"r-a": 3000, "r-b": 600, "r-c": 1500}
        for run, steps in want.items():
            assert json.loads(rows[run]["config"]) == {"lr": 0.1, "steps": steps, "model": {"width": 64},
                                                       **({"seed": 3} if run == "r-c" else {})}
        ui_sql = {r["run_id"]: json.loads(r["config"]) for r in reader.rows(load("runs"))}
        assert ui_sql == {r: json.loads(row["config"]) for r, row in rows.items()}
        history = reader.run_config("r-c")
        assert [(c["key"], c["step"], c["attempt"], c["before"], c["after"]) for c in history["changes"]] == [
            ("steps", 10, 0, 100, 1), ("seed", 12, 0, None, 3), ("steps", 12, 0, 1, 7),  # (an event's keys: sorted)
            ("steps", 15, 1, 7, 100), ("steps", 16, 1, 100, 1500)]  # (the resumed start set it back, then an update)
        assert reader.run_config("r-a")["changes"] == [{"key": "steps", "step": 10, "attempt": 0, "before": 100,
                                                        "after": 3000, "new": False}]
    finally:
        reader.close()
    con = queries.connect(updated_root)
    try:
        final = dict(con.execute("select distinct run_id, config_final from runs").fetchall())
        assert {r: json.loads(c) for r, c in final.items()} == ui_sql  # `runledger sql`'s runs view: the same
        started = con.execute("select config from runs where run_id = 'r-a'").fetchone()[0]
        assert json.loads(started)["steps"] == 100  # `config` stays the start's as declared (config_hash hashes it)
    finally:
        con.close()


def test_compare_diffs_the_updated_configs_and_opens_on_the_first_section_the_runs_share(updated_root):
    with client(updated_root, "127.0.0.1") as c:
        got = c.get("/api/compare?runs=r-a,r-b,r-c").json()
        diff = {d["key"]: d["values"] for d in got["diff"]}
        assert diff["steps"] == STEPS and set(diff) == {"steps", "seed"}  # not "the runs' configs are the same"
        assert got["labels"]["r-a"] == {"name": "name-r-a", "group": "sweep", "job_type": "train"}
        assert got["source"] == "metrics" and sorted(got["keys"]) == ["train/acc", "train/loss"]  # the first section, never "loss"
        assert set(got["series"]["train/loss"]) == {"r-a", "r-b", "r-c"} and set(got["series"]["train/loss"]["r-c"]) == {"0", "1"}
        assert {(m["source"], m["key"]) for m in got["metrics"]} == {("metrics", "train/loss"), ("metrics", "train/acc"),
                                                                     ("metrics", "val/loss")}
        picked = c.get("/api/compare?runs=r-a,mlflow-d3f07&source=metrics&keys=step_only_here").json()
        assert picked["keys"] == ["step_only_here"] and picked["series"]["step_only_here"]["r-a"] == {}
        assert picked["series"]["step_only_here"]["mlflow-d3f07"] == {"0": [[3], [1.0]]}
        for bad in ("keys=" + ",".join(f"k{i}" for i in range(17)), "keys=" + "x" * 301, "source=nope", "px=0"):
            r = c.get(f"/api/compare?runs=r-a&{bad}")
            assert r.status_code == 400 and len(r.text.splitlines()) == 1, bad


def test_the_runs_table_has_each_runs_last_value_of_the_chosen_metrics_and_its_display_name(updated_root):
    with client(updated_root, "127.0.0.1") as c:
        got = c.get("/api/runs").json()
        assert sorted(got["columns"]) == ["train/acc", "train/loss"]  # the first section the most runs have
        assert {m["name"]: m["runs"] for m in got["metrics"]} == {"train/loss": 4, "train/acc": 3, "val/loss": 3, "step_only_here": 1}
        rows = {r["run_id"]: r for r in got["runs"]}
        assert rows["r-c"]["last"]["train/loss"] == 0.5  # the resumed attempt's step 25, not attempt 0's step 20
        assert rows["r-a"]["last"] == {"train/acc": 0.2, "train/loss": pytest.approx(1.0)}
        assert rows["mlflow-d3f07"]["name"] == "bright-owl"  # the source's name, not mlflow-d3f07
        assert rows["r-a"]["name"] == "name-r-a" and rows["r-a"]["group"] == "sweep" and rows["r-a"]["job_type"] == "train"
        assert rows["r-a"]["duration_s"] == 20.0 and rows["r-c"]["attempts"] == 2
        chosen = c.get("/api/runs?metrics=val/loss,nothing").json()
        assert chosen["columns"] == ["val/loss", "nothing"]
        assert {r["run_id"]: r["last"]["val/loss"] for r in chosen["runs"]} == {"r-a": 2.0, "r-b": 2.0, "r-c": 2.0, "mlflow-d3f07": None}
        assert [r["run_id"] for r in c.get("/api/runs?name=owl").json()["runs"]] == ["mlflow-d3f07"]  # by its name too
        assert [r["run_id"] for r in c.get("/api/runs?config=steps%3D600").json()["runs"]] == ["r-b"]  # the updated config
        assert c.get("/api/runs?metrics=").json()["columns"] == []
        for bad in ("metrics=" + ",".join(f"m{i}" for i in range(17)), "metrics=" + "x" * 301):
            r = c.get(f"/api/runs?{bad}")
            assert r.status_code == 400 and len(r.text.splitlines()) == 1, bad


def test_the_metrics_a_view_opens_on_are_the_first_section_the_most_runs_share():
    assert default_metrics({}, 3) == []
    assert default_metrics({"loss": 2, "grad_norm": 2, "lr": 2, "mfu": 2}, 3) == ["loss", "grad_norm", "lr"]
    assert default_metrics({"extra/x": 1, "val/loss": 2, "train/loss": 2, "train/acc": 2}, 5) == ["train/loss", "train/acc"]
    assert default_metrics({"lr": 3, "val/loss": 3, "train/loss": 3}, 5) == ["lr"]  # (sections of one name: the first)
    assert default_metrics({"lr": 3, "train/m0": 3, "train/m1": 3, "train/m2": 1}, 5) == ["train/m0", "train/m1", "train/m2"]
    assert default_metrics({"train/loss": 3, "val/loss": 3, "train/acc": 3}, 5) == ["train/loss", "train/acc"]
    assert default_metrics({"train/loss": 4, "train/acc": 3, "val/loss": 3}, 3) == ["train/loss", "train/acc"]  # (the runs table: the most common first)
    metrics = [{"source": "system", "key": "cpu/percent", "runs": 2}, {"source": "metrics", "key": "a/b", "runs": 1}]
    assert opened_on(metrics, 6) == ("metrics", ["a/b"])  # system samples only where nothing else was logged
    assert opened_on(metrics[:1], 6) == ("system", ["cpu/percent"]) and opened_on([], 6) == ("step", [])
    both = [{"source": "step", "key": "loss", "runs": 1}, {"source": "metrics", "key": "train/loss", "runs": 2}]
    assert opened_on(both, 6) == ("metrics", ["train/loss"])  # the one both runs have


def test_a_runs_labels_are_its_starts_else_the_source_runs_own():
    def start(at: int, config: dict, name=None, group=None, job_type=None) -> list:
        return [str(at), "0", "0", "0", None, json.dumps(config), name, group, job_type]

    wandb = {"_import": {"source": "wandb", "source_run_id": "d3f07", "name": "bright-owl", "group": "sweep-1", "job_type": "eval"}}
    assert labels([start(1, wandb)]) == {"name": "bright-owl", "group": "sweep-1", "job_type": "eval"}
    assert labels([start(2, {}, name="later"), start(1, wandb, group="mine")]) == {"name": "later", "group": "mine", "job_type": "eval"}
    assert labels([start(1, {"lr": 1})]) == {"name": None, "group": None, "job_type": None}  # (the page shows its id)
    assert labels([start(1, {"_import": "not a dict"})])["name"] is None


def test_a_trainers_typed_steps_give_the_runs_table_and_compare_their_fields_loss_first(tmp_path):
    led = Ledger(tmp_path / "root")
    for attempt, (first, last) in enumerate([(1, 30), (21, 40)]):  # attempt 1 resumes at 21 and goes on to 40
        led.emit("typed", "run_started", {"config": {}, "config_hash": "0" * 64}, first - 1, T0, attempt=attempt)
        for k in range(first, last + 1):
            led.emit("typed", "step", {"loss": 3.0 - 0.01 * k - attempt, "grad_norm": 1.0, "lr": 1e-3, "tokens": 10,
                                       "step_time_s": 1.0}, k, T0 + timedelta(seconds=k + 100 * attempt), attempt=attempt)
    led.write()
    with client(tmp_path / "root", "127.0.0.1") as c:
        got = c.get("/api/runs").json()
        assert got["columns"] == ["loss", "grad_norm", "lr"]  # the contract's order: loss first
        assert got["runs"][0]["last"]["loss"] == pytest.approx(3.0 - 0.4 - 1)  # attempt 1's step 40
        shown = c.get("/api/compare?runs=typed").json()
        assert shown["source"] == "step" and shown["keys"][:3] == ["loss", "grad_norm", "lr"]
        assert set(shown["series"]["loss"]["typed"]) == {"0", "1"}  # each attempt its own series
