"""The W&B calls a script already makes, on a live run (the embedded local server and ledger): none raises, each
works or warns once naming itself, and what works is in the ledger, read back with SQL: a saved file's path
and SHA-256, strings logged, the summary define_metric asked for, its x axis. And `runledger ui` records
its address (no token) for init's one line, and takes it back when it stops."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from urllib.parse import urlparse

import numpy as np
import pytest

import runledger
from runledger.ledger import settings
from support import REPO
from support.processes import free_port
from support.reading import reader

SKIPPED = ["plot.line", "plot.confusion_matrix", "watch", "unwatch", "use_artifact",
           "login", "sweep", "log_code", "mark_preempting", "alert(webhook_url=)", "Artifact.add_reference"]


def test_every_wandb_call_works_or_warns_once_naming_itself(local_root, tmp_path, warnings_said, capsys):
    model, data = tmp_path / "model.pt", tmp_path / "data"
    model.write_bytes(b"weights " * 1000)
    data.mkdir()
    (data / "train.csv").write_text("x,y\n1,2\n")
    wandb = runledger  # as a W&B script has it: `import runledger as wandb`
    run = wandb.init(project="probe", name="probe-1", config={"lr": 0.1}, entity="team",
                     settings=wandb.Settings(start_method="thread"), system_metrics=False)
    line = capsys.readouterr().err.strip().splitlines()
    assert line == [f"runledger: run {run.run_id}{'' if run.name == run.run_id else f' ({run.name})'} logging to "
                    f"{local_root.resolve()}; view it with: runledger ui --root {local_root.resolve()}"]
    for _ in range(2):  # twice: each skipped call warns once
        url = urlparse(run.url)
        assert url.scheme == "http" and url.fragment == f"/run/{run.run_id}"
        assert run.dir.startswith(str(local_root)) and (local_root / "files" / run.run_id).is_dir()
        assert run.path == f"team/probe/{run.run_id}" and run.entity == "team"
        assert wandb.config.as_dict() == {"lr": 0.1} and run.config.as_dict()["lr"] == 0.1
        table = wandb.Table(columns=["a", "b"], data=[[1, "x"]])
        wandb.log({"samples": table, "img": wandb.Image(np.zeros((4, 4)), caption="c"),
                   "hist": wandb.Histogram(np.arange(10)), "loss": 1.0,
                   "curve": wandb.plot.line(table, "a", "b", title="t"),
                   "cm": wandb.plot.confusion_matrix(probs=None, y_true=[0], preds=[0], class_names=["a"])})
        wandb.watch(object(), log="all", log_freq=100)
        wandb.unwatch()
        assert wandb.use_artifact("team/probe/data:latest", type="dataset").name == "data"
        assert wandb.login(key="not-needed") is True
        assert [r.id for r in wandb.Api().runs("team/probe")] in ([], [run.run_id])  # (stored yet, or not)
        assert isinstance(wandb.sweep({"method": "grid", "parameters": {}}, project="probe"), str)
        run.log_code(".")
        run.mark_preempting()
        wandb.alert(title="slow", text="step time doubled", level=wandb.AlertLevel.WARN, webhook_url="https://hooks.example/x")
        artifact = wandb.Artifact("weights", type="model", metadata={"epoch": 1})
        artifact.add_reference("s3://bucket/weights")
    assert wandb.save(str(model), policy="now") == [str(model.resolve())]
    artifact.add_file(str(model))
    run.log_artifact(artifact)
    wandb.log_artifact(str(data), name="train-data", type="dataset")
    wandb.save(str(tmp_path / "*.later"), policy="end")
    (tmp_path / "final.later").write_text("written after save was called")
    assert run.finish()

    said = warnings_said()
    for name in SKIPPED:
        assert sum(m.startswith(name + ":") for m in said) == 1, (name, said)
    assert len(said) == len(SKIPPED), said
    db = reader(local_root)
    stored = db.execute("select via, name, type, path, sha256, bytes from artifacts where run_id = ? order by seq",
                        [run.run_id]).fetchall()
    sha = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (model, data / "train.csv", tmp_path / "final.later")}
    assert stored == [
        ("save", None, None, str(model.resolve()), sha[model], model.stat().st_size),
        ("log_artifact", "weights", "model", str(model.resolve()), sha[model], model.stat().st_size),
        ("log_artifact", "train-data", "dataset", str((data / "train.csv").resolve()), sha[data / "train.csv"], 8),
        ("save", None, None, str((tmp_path / "final.later").resolve()), sha[tmp_path / "final.later"], 29)]
    assert db.execute("select rule, severity from alerts where run_id = ?", [run.run_id]).fetchall() == [("slow", "warn")] * 2
    assert db.execute("select count(*) from metrics where run_id = ? and key = 'loss'", [run.run_id]).fetchall() == [(2,)]
    assert db.execute("select kind, count(*) from events where run_id = ? and kind in ('histogram', 'table', 'media') "
                      "group by kind order by kind", [run.run_id]).fetchall() == [("histogram", 2), ("media", 2), ("table", 2)]
    assert db.execute("select status from runs_finished where run_id = ?", [run.run_id]).fetchall() == [("completed",)]


def test_strings_none_and_dropped_steps_are_stored_and_define_metric_is_honoured(local_root, warnings_said):
    run = runledger.init(project="kinds", name="kinds-1", system_metrics=False)
    runledger.define_metric("val/*", summary="max", step_metric="epoch")
    runledger.define_metric("train/loss", summary="min")
    for step, loss in enumerate((3.0, 1.0, 2.0)):
        runledger.log({"train/loss": loss, "val/acc": 0.2 * step, "epoch": float(step), "phase": f"p{step}", "note": None,
                       "hist": [1, 2, 3]}, step=step)
        assert run.summary["train/loss"] == min((3.0, 1.0, 2.0)[: step + 1])  # read back during the run
    runledger.log({"train/loss": 9.0}, step=1)  # lower than step 2: dropped, as W&B drops it
    assert run.summary["train/loss"] == 1.0 and run.summary["val/acc"] == pytest.approx(0.4)
    assert run.finish()
    db = reader(local_root)
    text = db.execute("select step, text from metric_events where run_id = ? order by step", [run.run_id]).fetchall()
    assert text == [(s, {"phase": f"p{s}", "note": None}) for s in range(3)]
    assert db.execute("select step, value from metric('train/loss') where run_id = ? order by step",
                      [run.run_id]).fetchall() == [(0, 3.0), (1, 1.0), (2, 2.0)]
    [(summary,)] = db.execute("select summary from runs_finished where run_id = ?", [run.run_id]).fetchall()
    assert json.loads(summary) == {"train/loss": 1.0, "val/acc": 0.4, "epoch": 2.0, "phase": "p2", "note": None,
                                   "_dropped_steps": 1}
    axes = [json.loads(c)["_wandb"]["define_metric"] for (c,) in
            db.execute("select config from config_updates where run_id = ? order by seq", [run.run_id]).fetchall()]
    assert axes[-1] == {"val/*": {"summary": "max", "step_metric": "epoch"}, "train/loss": {"summary": "min"}}
    assert [m.split(":")[0] for m in warnings_said()] == ["log of a lower step"]
    assert db.execute("select step, counts from histograms where run_id = ? and key = 'hist' order by step",  # as W&B does
                      [run.run_id]).fetchall() == [(s, json.dumps([1] + [0] * 31 + [1] + [0] * 30 + [1]).replace(" ", ""))
                                                   for s in range(3)]


def test_the_dashboard_records_its_address_without_a_token_and_init_names_it(local_root, tmp_path, capsys):
    local_root.mkdir()
    port, token = free_port(), "a-token-no-job-log-may-show"
    (tmp_path / "token.json").write_text(json.dumps({"token": token}))
    (tmp_path / "token.json").chmod(0o600)
    log = open(tmp_path / "ui.log", "ab")
    ui = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ui", "--root", str(local_root), "--nats",
                           "nats://127.0.0.1:1", "--host", "0.0.0.0", "--port", str(port), "--token-file",
                           str(tmp_path / "token.json")], cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert ui.stdout.readline().strip() == f"http://0.0.0.0:{port}/", (tmp_path / "ui.log").read_text()
        recorded = (local_root / settings.DASHBOARD_FILE).read_text()
        assert json.loads(recorded)["url"] == f"http://0.0.0.0:{port}/" and token not in recorded
        run = runledger.init(project="seen", name="seen-1", system_metrics=False)
        line = capsys.readouterr().err
        assert line.count("\n") == 1 and line.endswith(f"view it at http://0.0.0.0:{port}/#/run/{run.run_id}\n")
        assert token not in line
        assert run.url == f"http://0.0.0.0:{port}/#/run/{run.run_id}"
        run.finish()
    finally:
        ui.send_signal(signal.SIGTERM)
        returncode = ui.wait(30)
        ui.stdout.close()
        log.close()
    assert returncode == 0 and not (local_root / settings.DASHBOARD_FILE).exists()


def test_init_says_nothing_when_silent(local_root, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_SILENT", "true")
    runledger.init(project="quiet", name="quiet-1", system_metrics=False).finish()
    monkeypatch.delenv("WANDB_SILENT")
    runledger.init(project="quiet", name="quiet-2", settings=runledger.Settings(silent=True), system_metrics=False).finish()
    assert capsys.readouterr().err == ""
