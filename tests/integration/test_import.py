"""`runledger import`: runs made by TensorBoard's writer, MLflow and W&B are imported through the real NATS and
ledger, every value compared with what was logged; a second import stores nothing; a grown source adds only
its new points; a changed source is refused, never forked.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from support.importers import HPARAMS, write_tensorboard
from support.processes import cli
from support.reading import reader

STATS_S = 0.25  # W&B's system-metrics sampling interval in the test run (its default is 15 s)


def kinds_stored(root: Path, run_id: str) -> dict[str, int]:
    return dict(reader(root).execute("select kind, count(*) from events where run_id = ? group by kind", [run_id]).fetchall())


def stored_points(root: Path, run_id: str) -> dict[tuple[int, str], tuple[float | None, str | None]]:
    rows = reader(root).execute("select step, key, value, nonfinite from metrics_all where run_id = ?", [run_id]).fetchall()
    out = {(s, k): (v, nf) for s, k, v, nf in rows}
    assert len(out) == len(rows), "a point stored twice"
    return out


def imported(root: Path, *args: str) -> str:
    done = cli("import", *args, "--root", str(root))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def verified(root: Path) -> None:
    done = cli("verify", "--root", str(root))
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------------------------ TensorBoard


def test_tensorboard_import_is_float32_exact_idempotent_and_grows_by_appends_only(local_root, tmp_path):
    rng = np.random.default_rng(19)
    logdir = tmp_path / "tb" / "mlp-1"
    logged = write_tensorboard(logdir, range(0, 40), rng)
    line = imported(local_root, "tensorboard", str(logdir))
    run_id = line.split(":")[0]
    assert run_id.startswith("tb-mlp-1-") and "83 new events" in line  # run_started, 40 steps of each file, hparams, run_finished

    stored = stored_points(local_root, run_id)
    assert len(stored) == len(logged)
    for (step, name), value in logged.items():
        if np.isnan(value):
            assert stored[(step, name)] == (None, "nan")
        else:  # the float32 as written, exactly (every float32 is a float64)
            assert stored[(step, name)] == (float(value), None), (step, name)
            assert np.float32(stored[(step, name)][0]) == value
    started = reader(local_root).execute("select config, tags, time from runs where run_id = ?", [run_id]).fetchall()
    assert '"source":"tensorboard"' in started[0][0] and '"uri":"' + str(logdir) + '"' in started[0][0]
    assert started[0][2] == "2023-11-14T22:13:20.000000Z"  # the first event's wall time
    hparams = reader(local_root).execute("select config from config_updates where run_id = ?", [run_id]).fetchall()
    assert [json.loads(c) for (c,) in hparams] == [HPARAMS]
    steps_view = reader(local_root).execute("select count(*) from steps where run_id = ?", [run_id]).fetchall()
    assert steps_view == [(40,)]  # `loss` makes the health checks' steps, as a runledger.log run's

    before = kinds_stored(local_root, run_id)
    assert "0 new events" in imported(local_root, "tensorboard", str(logdir))
    assert kinds_stored(local_root, run_id) == before
    verified(local_root)

    # the run goes on (a restarted writer: a new file) and the spool is gone (as on another machine)
    logged.update(write_tensorboard(logdir, range(40, 50), rng))
    shutil.rmtree(local_root / "spool")
    assert "21 new events" in imported(local_root, "tensorboard", str(logdir))  # 10 + 10 points and a new run_finished
    after = kinds_stored(local_root, run_id)
    assert after["metrics"] == before["metrics"] + 20 and after["run_finished"] == 2 and after["run_started"] == 1
    assert set(stored_points(local_root, run_id)) == set(logged)
    verified(local_root)

    # a changed past is refused in one line, and nothing is stored
    for f in sorted(logdir.glob("*tfevents*"))[:1]:
        f.write_bytes(f.read_bytes()[:-60])
    write_tensorboard(logdir, range(0, 5), np.random.default_rng(1))
    done = cli("import", "tensorboard", str(logdir), "--root", str(local_root))
    assert done.returncode == 2 and "source changed, not grew" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert kinds_stored(local_root, run_id) == after


# ------------------------------------------------------------------------------------ MLflow


def test_mlflow_import_keeps_every_history_point_params_tags_and_times(local_root, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("import-test")
    mrun = client.create_run(exp, tags={"team": "ml", "mlflow.runName": "r1"})
    source_id = mrun.info.run_id
    client.log_param(source_id, "lr", 3e-4)
    client.log_param(source_id, "layers", 4)
    rng = np.random.default_rng(3)
    t0 = 1_790_000_000_000
    for step in range(30):
        client.log_metric(source_id, "loss", float(rng.standard_normal()), timestamp=t0 + step * 1000, step=step)
        client.log_metric(source_id, "acc", math.nan if step == 5 else float(rng.random()), timestamp=t0 + step * 1000 + 7, step=step)
        client.log_metric(source_id, "system/cpu_utilization_percentage", float(rng.random() * 100), timestamp=t0 + step * 1000, step=step)
    client.set_terminated(source_id, "FINISHED", end_time=t0 + 31_000)

    run_id = imported(local_root, "mlflow", uri).split(":")[0]
    assert run_id == f"mlflow-{source_id}"
    stored = stored_points(local_root, run_id)
    for key in ("loss", "acc"):
        for m in client.get_metric_history(source_id, key):
            assert stored[(m.step, key)] == ((None, "nan") if math.isnan(m.value) else (m.value, None))
    assert len(stored) == 60
    system = reader(local_root).execute("select step, key, value from system_metrics where run_id = ?", [run_id]).fetchall()
    history = {(m.step, m.value) for m in client.get_metric_history(source_id, "system/cpu_utilization_percentage")}
    assert {(s, v) for s, k, v in system if k == "cpu_utilization_percentage"} == history and len(system) == 30
    config, tags, project, at = reader(local_root).execute(
        "select config, tags, project, time from runs where run_id = ?", [run_id]).fetchall()[0]
    assert '"layers":"4"' in config and '"lr":"0.0003"' in config and '"source_run_id":"' + source_id in config
    assert "team=ml" in tags and project == "import-test"
    assert at == f"{_millis(mrun.info.start_time)}"
    finished = reader(local_root).execute("select status, time from runs_finished where run_id = ?", [run_id]).fetchall()
    assert finished == [("completed", _millis(t0 + 31_000))]

    before = kinds_stored(local_root, run_id)
    assert "0 new events" in imported(local_root, "mlflow", uri, "--source-run", source_id)
    assert kinds_stored(local_root, run_id) == before

    # the run is reopened and logs 5 more steps: only those (and its new end) are added
    client.update_run(source_id, status="RUNNING")
    for step in range(30, 35):
        client.log_metric(source_id, "loss", float(step), timestamp=t0 + step * 1000, step=step)
    client.set_terminated(source_id, "FAILED", end_time=t0 + 40_000)
    assert "6 new events" in imported(local_root, "mlflow", uri)
    assert len(stored_points(local_root, run_id)) == 65
    assert reader(local_root).execute("select status from runs_finished where run_id = ? order by seq",
                                      [run_id]).fetchall() == [("completed",), ("failed",)]
    verified(local_root)


def _millis(ms: int) -> str:
    from runledger.interop.importers.source import millis_text

    return millis_text(ms)


# ------------------------------------------------------------------------------------ W&B


def test_wandb_offline_run_import_is_exact_and_a_run_still_writing_is_completed_later(local_root, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    rng = np.random.default_rng(4)
    logged = {}
    run = wandb.init(project="imports", config={"lr": 3e-4, "opt": {"name": "adam"}}, tags=["baseline"],
                     settings=wandb.Settings(console="off", save_code=False, disable_git=True,
                                             x_stats_sampling_interval=STATS_S))
    for step in range(40):
        values = {"loss": float(rng.standard_normal()), "val/acc": float(rng.random()), "nested": {"a": float(step)}}
        if step == 7:
            values["loss"] = math.inf
        run.log(values, step=step)
        logged.update({(step, "loss"): values["loss"], (step, "val/acc"): values["val/acc"], (step, "nested/a"): float(step)})
    run.config.update({"late": 7})
    time.sleep(4 * STATS_S)  # a few samples of the machine (W&B's `stats` records)
    source_id = run.id
    run.finish()
    wandb.teardown()  # (its service has written the whole run file once it is down: finish() may return before)
    run_file = next((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))

    # a copy cut short in the middle, as a run still writing leaves it: what is whole is imported
    partial = tmp_path / "partial" / run_file.name
    partial.parent.mkdir()
    partial.write_bytes(run_file.read_bytes()[: run_file.stat().st_size * 2 // 3])
    first = imported(local_root, "wandb", str(partial))
    run_id = first.split(":")[0]
    assert run_id == f"wandb-{source_id}" and kinds_stored(local_root, run_id).get("run_finished") is None

    assert "new events" in imported(local_root, "wandb", str(run_file.parent))  # the whole run: the rest of it
    stored = stored_points(local_root, run_id)
    assert len(stored) == len(logged)
    for key, value in logged.items():
        assert stored[key] == ((None, "inf") if math.isinf(value) else (value, None)), key
    config, tags, project = reader(local_root).execute("select config, tags, project from runs where run_id = ?",
                                                       [run_id]).fetchall()[0]
    assert '"lr":0.0003' in config and '"opt":{"name":"adam"}' in config and "baseline" in tags and project == "imports"
    assert reader(local_root).execute("select config from config_updates where run_id = ?", [run_id]).fetchall() == [('{"late":7}',)]
    assert reader(local_root).execute("select status, final_step from runs_finished where run_id = ?",
                                      [run_id]).fetchall() == [("completed", 39)]
    from wandb.proto import wandb_internal_pb2 as pb

    from runledger.interop.importers.wandb import records

    samples = [r.stats for r in map(pb.Record.FromString, records(run_file)) if r.WhichOneof("record_type") == "stats"]
    system = reader(local_root).execute("select time, key, value from system_metrics where run_id = ?", [run_id]).fetchall()
    assert samples and len({t for t, _, _ in system}) == len(samples)
    memory = [json.loads(i.value_json) for s in samples for i in s.item if i.key == "proc.memory.rssMB"]
    assert sorted(v for _, k, v in system if k == "proc.memory.rssMB") == sorted(memory)

    before = kinds_stored(local_root, run_id)
    assert "0 new events" in imported(local_root, "wandb", str(run_file))
    assert kinds_stored(local_root, run_id) == before
    verified(local_root)
