"""The W&B calls beyond init/log/finish, their pure parts (no server: a run in mode "disabled" records nothing):
what `log` accepts besides numbers, a lower step dropped, define_metric's summary read back during the run,
the mode from the argument or the environment, init's one line and the dashboard's address it names.
The same calls on a live run, read back with SQL: tests/integration/test_wandb_calls.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import runledger
from runledger import wandb_compat
from runledger.core import LogError, metrics_payload
from runledger.ledger import settings


@pytest.fixture
def disabled(tmp_path, monkeypatch):
    """A run that records nothing, at a root that must stay unmade."""
    monkeypatch.setenv("RUNLEDGER_ROOT", str(tmp_path / "never-made"))
    for var in ("RUNLEDGER_MODE", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    run = runledger.init(project="p", name="off", mode="disabled", system_metrics=False)
    yield run
    run.finish()


def test_numbers_keep_the_fast_path_and_strings_and_none_are_stored_in_text(warnings_said):
    names: set[str] = set()
    assert metrics_payload({"a": 1.0, "b": 2}, names) == {"metrics": {"a": 1.0, "b": 2}}
    out = metrics_payload({"loss": 0.5, "phase": "warmup", "note": None, "nested": {"tag": "x"}}, names)
    assert out == {"metrics": {"loss": 0.5}, "text": {"phase": "warmup", "note": None, "nested/tag": "x"}}
    assert out == metrics_payload({"loss": 0.5, "phase": "warmup", "note": None, "nested": {"tag": "x"}}, names)
    assert warnings_said() == []


def test_a_list_an_array_or_a_wandb_value_is_handed_on_and_a_chart_skipped_with_one_warning(disabled, warnings_said):
    names: set[str] = set()
    logged = {"h": [1, 2], "a": np.zeros(3), "t": runledger.Table(columns=["x"]), "i": runledger.Image(np.zeros((2, 2))),
              "g": runledger.Histogram([1, 2]), "c": runledger.plot.line(None, "x", "y"), "o": object()}
    out = metrics_payload({"loss": 1.0, **logged, "s": np.float32(2.5)}, names)
    assert out == {"metrics": {"loss": 1.0, "s": 2.5}, "rich": logged}  # (runledger.values makes them events: test_values)
    for _ in range(3):
        runledger.log({"loss": 1.0, **logged})
    said = warnings_said()
    for name in ("plot.line", "log of a object"):
        assert sum(m.startswith(name + ":") for m in said) == 1, (name, said)
    assert len(said) == 2  # (a chart from plot.* is not warned about twice)
    assert disabled.summary["_skipped_values"] == 6  # the chart and the object, each time


def test_a_lower_step_is_dropped_with_one_warning_and_counted(disabled, warnings_said):
    for step in (0, 1, 5, 3, 2, 5, 6):
        runledger.log({"loss": float(step)}, step=step)
    runledger.log({"loss": 7.0})
    assert disabled.summary["_dropped_steps"] == 2 and disabled.summary["loss"] == 7.0 and disabled.step == 8
    assert [m for m in warnings_said() if m.startswith("log of a lower step")] == [
        "log of a lower step: step 3 is below step 5, the last this attempt logged: dropped, as W&B does "
        "(counted in the summary's _dropped_steps) (skipped; said once)"]


def test_a_resumed_attempt_may_redo_lower_steps():
    from runledger.core import Run
    from runledger.ledger.emit.sink import NullSink

    run = Run("r", project=None, name=None, root=None, sink=NullSink(), attempt=1, config={}, tags=[], first_step=10,
              attachment=None, mode="disabled")
    for step in (4, 5, 6):
        run.log({"loss": float(step)}, step=step)
    assert "_dropped_steps" not in run.summary and run.step == 10


def test_summary_reads_back_during_the_run_as_define_metric_asked(disabled):
    assert dict(runledger.summary) == {}
    runledger.define_metric("train/loss", summary="min", goal="minimize")
    runledger.define_metric("val/*", summary="max,mean", step_metric="epoch")
    runledger.define_metric("lr", summary="none")
    runledger.define_metric("acc", summary="best", goal="maximize")
    runledger.define_metric("epoch")
    for loss, val, acc in ((3.0, 0.1, 0.2), (1.0, 0.5, 0.9), (2.0, 0.3, float("nan"))):
        runledger.log({"train/loss": loss, "val/acc": val, "lr": 0.1, "acc": acc, "other": loss, "epoch": 1.0})
    summary = dict(disabled.summary)
    assert summary == {"train/loss": 1.0, "val/acc.max": 0.5, "val/acc.mean": pytest.approx(0.3), "acc": 0.9,
                       "other": 2.0, "epoch": 1.0}
    assert runledger.run.summary["train/loss"] == 1.0
    disabled.summary["best_note"] = "set by hand"
    assert disabled.config["_wandb"]["define_metric"] == {
        "train/loss": {"summary": "min", "goal": "minimize"}, "val/*": {"summary": "max,mean", "step_metric": "epoch"},
        "lr": {"summary": "none"}, "acc": {"summary": "best", "goal": "maximize"}}
    assert disabled.config.as_dict()["_wandb"]["define_metric"]["val/*"]["step_metric"] == "epoch"


def test_the_mode_comes_from_the_argument_then_settings_then_the_environment(monkeypatch):
    for var in ("RUNLEDGER_MODE", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    assert wandb_compat.mode_of(None) == "online"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_compat.mode_of(None) == "offline"
    monkeypatch.setenv("RUNLEDGER_MODE", "disabled")
    assert wandb_compat.mode_of(None) == "disabled"
    assert wandb_compat.mode_of(None, runledger.Settings(mode="online")) == "online"
    assert wandb_compat.mode_of("offline", runledger.Settings(mode="online")) == "offline"
    with pytest.raises(LogError, match="mode 'sideways'"):
        runledger.init(mode="sideways")


def test_wandb_mode_disabled_records_nothing_and_every_call_works(tmp_path, monkeypatch, capsys, warnings_said):
    root = tmp_path / "never-made"
    monkeypatch.setenv("RUNLEDGER_ROOT", str(root))
    monkeypatch.delenv("RUNLEDGER_MODE", raising=False)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    (tmp_path / "model.pt").write_bytes(b"weights")
    with runledger.init(project="ci", config={"lr": 1e-3}) as run:
        assert run.mode == "disabled" and run.url is None and os.path.isdir(run.dir)
        runledger.log({"loss": 1.0, "phase": "a"})
        runledger.config["late"] = 2
        runledger.define_metric("loss", summary="min")
        assert runledger.save(str(tmp_path / "model.pt"))
        runledger.log_artifact(str(tmp_path / "model.pt"), type="model")
        runledger.alert("t", "x")
        assert run.summary["loss"] == 1.0
    assert not root.exists()
    assert capsys.readouterr().err == ""


def test_inits_line_names_the_run_the_root_and_where_to_look_without_a_token(disabled, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    disabled.root = root
    line = wandb_compat.where_line(disabled)
    rid = disabled.run_id  # (a fresh id made of the name "off")
    assert rid.startswith("off-")
    assert line == f"runledger: run {rid} (off) logging to {root}; view it with: runledger ui --root {root}"
    settings.record_dashboard(root, "http://127.0.0.1:8999/")  # (this process "serves" it: it runs)
    assert wandb_compat.where_line(disabled).endswith(f"view it at http://127.0.0.1:8999/#/run/{rid}")
    facts = json.loads((root / settings.DASHBOARD_FILE).read_text())
    facts["pid"] = 2**22 + 12345  # a process that is gone: its address is not given
    (root / settings.DASHBOARD_FILE).write_text(json.dumps(facts))
    assert settings.dashboard_url(root) is None
    settings.record_dashboard(root, "http://127.0.0.1:8999/")
    settings.forget_dashboard(root)
    assert not (root / settings.DASHBOARD_FILE).exists()
    later = tmp_path / "no-run-yet" / "root"  # a dashboard opened before the root's first run: recorded all the same
    assert settings.record_dashboard(later, "http://127.0.0.1:8998/") and settings.dashboard_url(later) == "http://127.0.0.1:8998/"


def test_silent_by_the_environment_or_the_settings(monkeypatch):
    for var in ("RUNLEDGER_SILENT", "WANDB_SILENT", "WANDB_QUIET"):
        monkeypatch.delenv(var, raising=False)
    assert not wandb_compat.silent() and not wandb_compat.silent(runledger.Settings(console="off"))
    assert wandb_compat.silent(runledger.Settings(silent=True)) and wandb_compat.silent({"quiet": True})
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert wandb_compat.silent()


def test_the_wandb_objects_take_their_usual_arguments(tmp_path, warnings_said):
    t = runledger.Table(columns=["a", "b"], data=[[1, 2]])
    t.add_data(3, 4)
    t.add_column("c", [5, 6])
    assert t.get_column("c") == [5, 6] and runledger.Table(data=np.ones((2, 3))).columns == ["c0", "c1", "c2"]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"x")
    art = runledger.Artifact("data", type="dataset", description="d", metadata={"n": 1})
    art.add_file(local_path=str(tmp_path / "d" / "x.bin"), name="x", policy="immutable")
    art.add_dir(str(tmp_path / "d"))
    art.add_reference("s3://bucket/key")
    assert len(art.files) == 2
    assert runledger.login(key="k") is True and runledger.Settings(mode="offline").mode == "offline"
    api = runledger.Api()  # (the real read API: runledger.api; a root with no runs has none)
    assert api.runs("e/p") == []
    with pytest.raises(runledger.ApiError, match="no run has the id or name 'r'"):
        api.run("e/p/r")
    assert isinstance(runledger.sweep({"method": "grid"}, project="p"), str)
    runledger.watch(None, log="all", log_freq=10)
    said = warnings_said()
    assert [m.split(":")[0] for m in said] == ["Artifact.add_reference", "login", "sweep", "watch"]
