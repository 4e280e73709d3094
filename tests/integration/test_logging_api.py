"""The logging API (`import runledger`): any loop logs any names in one line, through the embedded local
server and ledger, and what `log` accepted is stored once, whatever happens to the script.

Each test logs as a user would (in this process, or as a script in a child process that a test kills),
then reads the ledger back with SQL and checks the promise: the exact values, nothing lost, nothing
doubled, non-finite values flagged, bad input refused at the call site, crashes recorded as such.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import runledger
from runledger.ledger import local
from runledger.ledger.contract.events import MAX_METRIC_NAME, MAX_METRICS
from support import REPO
from support.reading import reader


def run_script(code: str, root: Path, *args: str, wait: bool = True, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    """A user's script in a child process, logging to `root` through the embedded default."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    env.update(RUNLEDGER_ROOT=str(root), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    if wait:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, **kw)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_log_stores_every_value_exactly_and_flags_the_non_finite(local_root):
    rng = random.Random(7)
    names = [f"train/layer_{i}/norm" for i in range(17)] + ["loss", "val/accuracy", "router/layer_3/entropy"]
    logged = {}
    with runledger.init(project="exact", id="exact-1", config={"lr": 3e-4, "layers": 4}, tags=["t1"],
                        system_metrics=False) as run:
        for step in range(300):
            values = {n: rng.uniform(-1e3, 1e3) for n in names}
            values["val/accuracy"] = np.float32(0.25)  # numpy scalars are numbers too
            values["count"] = step  # ints are kept exactly (as floats up to 2**53)
            runledger.log(values)
            logged[step] = {k: float(v) for k, v in values.items()}
        runledger.log({"loss": float("nan"), "grad": math.inf, "neg": -math.inf, "ok": 1.5}, step=300)
        runledger.log({"nested": {"a": 1.0, "b": {"c": 2.0}}}, step=301)
    assert run.finished
    rows = reader(local_root).execute("select step, key, value, nonfinite from metrics where run_id = 'exact-1'").fetchall()
    stored = {(s, k): (v, nf) for s, k, v, nf in rows}
    assert len(rows) == 300 * 21 + 4 + 2  # nothing lost, nothing doubled
    for step, values in logged.items():
        for k, v in values.items():
            assert stored[(step, k)] == (v, None), (step, k)
    assert stored[(300, "loss")] == (None, "nan")
    assert stored[(300, "grad")] == (None, "inf")
    assert stored[(300, "neg")] == (None, "-inf")
    assert stored[(300, "ok")] == (1.5, None)
    assert stored[(301, "nested/a")] == (1.0, None) and stored[(301, "nested/b/c")] == (2.0, None)
    # a NaN loss is a skipped step for the health checks, as a typed step's would be
    assert reader(local_root).execute("select skipped from steps where run_id = 'exact-1' and step = 300").fetchall() == [(True,)]
    started = reader(local_root).execute("select project, tags, config from runs where run_id = 'exact-1'").fetchall()
    assert started[0][0] == "exact" and json.loads(started[0][1]) == ["t1"] and json.loads(started[0][2]) == {"lr": 3e-4, "layers": 4}
    finished = reader(local_root).execute("select status, final_step, summary from runs_finished where run_id = 'exact-1'").fetchall()
    assert finished[0][:2] == ("completed", 301)
    assert json.loads(finished[0][2])["loss"] is None  # the last loss was NaN: null, never dropped
    assert runledger_cli("verify", "--root", str(local_root)).returncode == 0


def runledger_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runledger.tools.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_bad_input_gets_a_one_line_error_and_loses_nothing_accepted(local_root):
    run = runledger.init(id="bad-input", system_metrics=False)
    runledger.log({"loss": 1.0}, step=0)
    bad = [
        ({"x" * (MAX_METRIC_NAME + 1): 1.0}, "characters"),
        ({"": 1.0}, "characters"),
        ({"a\nb": 1.0}, "control character"),
        ({1: 1.0}, "is not a string"),
        ({f"k{i}": 1.0 for i in range(MAX_METRICS + 1)}, f"at most {MAX_METRICS}"),
        ([("loss", 1.0)], "takes a dict"),
    ]
    for data, reason in bad:
        with pytest.raises(runledger.LogError) as err:
            runledger.log(data)
        assert reason in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(runledger.LogError, match="is not an integer"):
        runledger.log({"loss": 1.0}, step=-1)
    runledger.log({"loss": 2.0}, step=1)
    assert run.finish()
    rows = reader(local_root).execute("select step, value from metrics where run_id = 'bad-input' order by step").fetchall()
    assert rows == [(0, 1.0), (1, 2.0)]


def test_an_existing_run_is_resumed_only_when_asked(local_root):
    runledger.init(id="twice", system_metrics=False).finish()
    with pytest.raises(runledger.LogError, match="exists; pass resume=True"):
        runledger.init(id="twice", system_metrics=False)
    with pytest.raises(runledger.LogError, match="does not exist"):
        runledger.init(id="never-made", resume="must", system_metrics=False)
    again = runledger.init(id="twice", resume=True, system_metrics=False)
    assert again.attempt == 1
    again.finish()


def test_a_name_is_a_label_every_init_a_new_run_and_resume_goes_on_with_the_one_of_that_name(local_root, caplog):
    first = runledger.init(project="p", name="My Run", system_metrics=False, group="g", job_type="train", notes="a\nb")
    first.finish()
    second = runledger.init(project="p", name="My Run", system_metrics=False)  # run again: a new run, no error
    second.finish()
    assert first.id != second.id and first.id.startswith("my-run-") and second.id.startswith("my-run-")
    assert first.name == second.name == "My Run"
    with pytest.raises(runledger.LogError, match="2 runs are named 'My Run'"):
        runledger.init(project="p", name="My Run", resume="must", system_metrics=False)
    with pytest.raises(runledger.LogError, match="no run is named 'nobody'"):
        runledger.init(project="p", name="nobody", resume="must", system_metrics=False)
    third = runledger.init(project="p", name="My Run", resume=True, system_metrics=False)  # which? neither: a new one
    third.finish()
    assert third.id not in (first.id, second.id) and third.attempt == 0
    assert "2 runs are named 'My Run'" in caplog.text  # (one warning, naming them)
    solo = runledger.init(project="q", name="solo", system_metrics=False)
    solo.finish()
    again = runledger.init(project="q", name="solo", resume=True, system_metrics=False)  # the one of that name
    assert (again.id, again.attempt) == (solo.id, 1)
    again.finish()
    elsewhere = runledger.init(project="other", name="solo", resume=True, system_metrics=False)  # names are per project
    elsewhere.finish()
    assert elsewhere.id != solo.id and elsewhere.attempt == 0
    db = reader(local_root)
    assert db.execute("select name, count(distinct run_id) from run_names group by name order by name").fetchall() == [
        ("My Run", 3), ("solo", 2)]
    assert db.execute("select \"group\", job_type, notes, config from runs where run_id = ?", [first.id]).fetchall() == [
        ("g", "train", "a\nb", "{}")]  # real columns, not the config's `_wandb`
    assert db.execute("select count(*) from runs where run_id = ? and name = 'solo'", [solo.id]).fetchall() == [(2,)]


def test_a_run_stored_before_names_were_kept_is_named_by_its_id_and_found_by_its_old_name(local_root):
    old = runledger.init(project="p", id="my-old-run", system_metrics=False)  # run_started without a name: as every
    old.finish()                                                               # run stored before names were kept
    db = reader(local_root)
    assert db.execute("select name from runs where run_id = 'my-old-run'").fetchall() == [("my-old-run",)]
    assert db.execute("select name from run_names").fetchall() == [("my-old-run",)]
    # an old script that resumes by name goes on with the run its name was made the id of
    again = runledger.init(project="p", name="My Old Run", resume=True, system_metrics=False)
    assert (again.id, again.attempt) == ("my-old-run", 1)
    again.finish()


SCRIPT_LOGS_UNTIL_KILLED = """
    import sys, runledger
    run = runledger.init(id=sys.argv[1], resume=sys.argv[2] == "resume", system_metrics=False)
    print("attempt", run.attempt, "first", run.step, flush=True)
    for i in range(int(sys.argv[3])):
        runledger.log({"loss": 1.0 / (run.step + 1), "step_seen": float(run.step)})
        print("logged", run.step - 1, flush=True)  # after log returned: accepted
    run.finish()
"""


def test_sigkill_mid_run_then_resume_loses_nothing_log_accepted(local_root):
    child = run_script(SCRIPT_LOGS_UNTIL_KILLED, local_root, "killed", "new", "100000000", wait=False)
    accepted = []
    for line in child.stdout:
        if line.startswith("logged"):
            accepted.append(int(line.split()[1]))
            if len(accepted) >= 3000:
                child.send_signal(signal.SIGKILL)
                break
    child.wait()
    accepted += [int(line.split()[1]) for line in child.stdout.read().splitlines(keepends=True)
                 if line.startswith("logged") and line.endswith("\n")]  # (the kill may cut the last line short)
    assert accepted == list(range(len(accepted)))

    second = run_script(SCRIPT_LOGS_UNTIL_KILLED, local_root, "killed", "resume", "500")
    assert second.returncode == 0, second.stderr
    header = second.stdout.splitlines()[0].split()
    assert header[1] == "1", second.stdout  # the attempt went up
    first = int(header[3])
    assert first >= len(accepted)  # counting on from the last step the killed attempt logged

    rows = reader(local_root).execute(
        "select attempt, step, count(*) from metrics_all where run_id = 'killed' and key = 'loss' group by all").fetchall()
    by_attempt = {}
    for attempt, step, n in rows:
        assert n == 1, (attempt, step)  # nothing doubled
        by_attempt.setdefault(attempt, set()).add(step)
    assert set(accepted) <= by_attempt[0]  # everything the killed script's log accepted
    assert by_attempt[1] == set(range(first, first + 500))
    assert runledger_cli("verify", "--root", str(local_root)).returncode == 0


SCRIPT_EIGHT = """
    import sys, runledger
    run = runledger.init(project="many", id=sys.argv[1], system_metrics=False)
    for step in range(int(sys.argv[2])):
        runledger.log({f"m{j}": step + j / 10 for j in range(20)})
    assert run.finish()
"""


def test_eight_processes_log_to_one_root_through_one_server_and_one_ledger(local_root):
    steps = 1500
    children = [run_script(SCRIPT_EIGHT, local_root, f"proc-{i}", str(steps), wait=False) for i in range(8)]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
    rows = reader(local_root).execute(
        "select run_id, count(*), count(distinct (step, key)) from metrics_all group by run_id order by run_id").fetchall()
    assert rows == [(f"proc-{i}", steps * 20, steps * 20) for i in range(8)]
    log_text = (local.local_dir(local_root) / "supervisor.log").read_text()
    assert log_text.count("local server of") == 1, log_text  # one supervisor: one server, one ledger
    assert log_text.count("ledger serving") == 1, log_text
    assert runledger_cli("verify", "--root", str(local_root)).returncode == 0


WANDB_SCRIPT = """
    import random
    import runledger as wandb

    wandb.init(project="cifar", config={"learning_rate": 0.01, "epochs": 3, "batch_size": 64}, tags=["baseline"])
    config = wandb.config
    wandb.define_metric("val/*", step_metric="epoch")
    random.seed(0)
    best = 0.0
    for epoch in range(config.epochs):
        for batch in range(10):
            loss = 2.0 / (1 + epoch * 10 + batch) + random.random() * 0.01
            wandb.log({"train/loss": loss, "train/lr": config.learning_rate})
        acc = 0.5 + 0.1 * epoch
        wandb.log({"val/accuracy": acc, "epoch": epoch})
        best = max(best, acc)
    wandb.run.summary["best_accuracy"] = best
    wandb.alert(title="done", text=f"best accuracy {best}", level=wandb.AlertLevel.INFO)
    wandb.finish()
"""


def test_a_wandb_script_runs_with_only_its_import_changed(local_root):
    r = run_script(WANDB_SCRIPT, local_root)
    assert r.returncode == 0, r.stderr
    db = reader(local_root)
    [(run_id,)] = db.execute("select run_id from runs").fetchall()
    assert run_id.startswith("cifar-")
    losses = db.execute("select count(*) from metrics where key = 'train/loss'").fetchall()
    assert losses == [(30,)]
    assert db.execute("select step, value from metrics where key = 'val/accuracy' order by step").fetchall() == [
        (10, 0.5), (21, 0.6), (32, 0.7)]
    status, summary = db.execute("select status, summary from runs_finished").fetchall()[0]
    assert status == "completed" and json.loads(summary)["best_accuracy"] == 0.7
    assert db.execute("select rule, severity, message from alerts").fetchall() == [("done", "info", "best accuracy 0.7")]


CRASHING = """
    import os, signal, sys, time, runledger
    run = runledger.init(id=sys.argv[1], system_metrics=False)
    runledger.log({"loss": 1.0})
    if sys.argv[2] == "raise":
        raise RuntimeError("out of memory, say")
    print("ready", flush=True)
    while True:
        runledger.log({"loss": 1.0})
        time.sleep(0.001)
"""


@pytest.mark.parametrize("how, status, reason", [
    ("raise", "failed", "RuntimeError: out of memory, say"),
    ("sigterm", "stopped", "SIGTERM"),
    ("sigint", "stopped", "SIGINT"),
])
def test_a_crash_or_a_signal_finishes_the_run_as_failed_or_stopped(local_root, how, status, reason):
    name = f"crash-{how}"
    if how == "raise":
        r = run_script(CRASHING, local_root, name, how)
        assert r.returncode != 0 and "out of memory" in r.stderr
    else:
        child = run_script(CRASHING, local_root, name, how, wait=False)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        child.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        child.communicate(timeout=120)
        assert child.returncode != 0
    rows = reader(local_root).execute(f"select status, reason from runs_finished where run_id = '{name}'").fetchall()
    assert rows == [(status, reason)]
    assert runledger_cli("verify", "--root", str(local_root)).returncode == 0


def test_system_metrics_are_sampled_in_the_background(local_root):
    run = runledger.init(id="sys", system_metrics=0.2)
    for step in range(20):
        runledger.log({"loss": 1.0})
        time.sleep(0.05)
    assert run.finish()
    keys = {k for (k,) in reader(local_root).execute("select distinct key from system_metrics where run_id = 'sys'").fetchall()}
    assert {"cpu/percent", "memory/used_bytes", "process/rss_bytes", "disk/percent"} <= keys


def test_with_runledger_nats_set_the_same_api_logs_to_that_server(ledger_process, nats_server, root, tmp_path, monkeypatch):
    ledger_process.start()
    monkeypatch.setenv("RUNLEDGER_NATS", nats_server.url)
    monkeypatch.setenv("RUNLEDGER_ROOT", str(tmp_path / "client"))  # the client's spool; the ledger is elsewhere
    run = runledger.init(id="remote", system_metrics=False)
    for step in range(100):
        runledger.log({"loss": 1.0 / (step + 1)})
    assert run.finish()
    assert reader(root).execute("select count(*) from metrics where run_id = 'remote'").fetchall() == [(100,)]
    assert not local.local_dir(tmp_path / "client").exists()  # no local server was started


def test_the_local_ledger_killed_mid_run_loses_nothing(local_root):
    run = runledger.init(id="survivor", system_metrics=False)
    for step in range(200):
        runledger.log({"loss": 1.0 / (step + 1)})
    deadline = time.monotonic() + 60  # (init does not wait for the supervisor it started: here it must be up)
    while local.running_url(local_root) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = json.loads((local.local_dir(local_root) / "state.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)  # the supervisor, and the ledger in it
    for step in range(200, 400):
        runledger.log({"loss": 1.0 / (step + 1)})
    run.finish(timeout=3)  # no ledger to confirm: the events wait in JetStream (or the spool)
    again = runledger.init(id="after", system_metrics=False)  # starts a new supervisor, whose ledger catches up
    assert again.finish(wait=True)
    deadline = time.monotonic() + 60  # (the killed run's leftovers go in from its spool, beside the new run)
    while True:
        rows = reader(local_root).execute(
            "select count(*), count(distinct step), min(step), max(step) from metrics where run_id = 'survivor'").fetchall()
        if rows == [(400, 400, 0, 399)] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows == [(400, 400, 0, 399)]
    assert runledger_cli("verify", "--root", str(local_root)).returncode == 0


def test_finish_starts_the_supervisor_again_when_it_died_mid_run(local_root):
    run = runledger.init(id="orphan", system_metrics=False)
    deadline = time.monotonic() + 60
    while local.running_url(local_root) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = json.loads((local.local_dir(local_root) / "state.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    while local.running_url(local_root) is not None:  # (its lock goes with it)
        time.sleep(0.01)
    for step in range(50):
        runledger.log({"loss": 1.0 / (step + 1)})
    assert run.finish()  # hands its chain over: a supervisor must be there to store it, without another init
    deadline = time.monotonic() + 60
    while (rows := reader(local_root).execute("select count(*) from metrics where run_id = 'orphan'").fetchall()) != [(50,)]:
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert local.running_url(local_root) is not None


def test_a_resumed_run_supersedes_the_steps_it_redoes(local_root):
    first = runledger.init(id="redo", system_metrics=False)
    for step in range(100):
        runledger.log({"loss": 1.0, "lr": 0.1}, step=step)
    first.finish()
    second = runledger.init(id="redo", resume=True, system_metrics=False)  # back to a checkpoint at step 50
    for step in range(50, 80):
        runledger.log({"loss": 2.0, "lr": 0.2}, step=step)
    second.finish()
    db = reader(local_root)
    expected = [(0, 0, 49, 50), (1, 50, 79, 30)]  # attempt 0's steps from 50 on were redone: superseded
    assert db.execute("select attempt, min(step), max(step), count(*) from metrics where run_id = 'redo' "
                      "and key = 'loss' group by attempt order by attempt").fetchall() == expected
    assert db.execute("select attempt, min(step), max(step), count(*) from metric('loss') where run_id = 'redo' "
                      "group by attempt order by attempt").fetchall() == expected
    assert db.execute("select count(*) from metrics_all where run_id = 'redo' and key = 'loss'").fetchall() == [(130,)]


def test_the_local_server_stops_when_idle_and_down_stops_it(tmp_path, monkeypatch):
    for var in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "idle"
    first = local.attach(root, idle_s=0.5)
    assert local.running_url(root) == first.url
    first.release()
    deadline = time.monotonic() + 30
    while local.running_url(root) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert local.running_url(root) is None  # idle: stopped by itself
    second = local.attach(root, idle_s=60)
    assert local.running_url(root) is not None
    assert local.down(root)
    assert local.running_url(root) is None
    second.release()


def test_attaching_while_another_process_s_server_starts_waits_for_it_rather_than_starting_a_second(local_root):
    """A run's `init` starts the root's server without waiting (wait=False); a process that attaches and
    waits while that one is still starting (a short run can finish first, on a loaded machine) takes the
    same server. Starting a second one made it lose the race for the supervisor's lock and exit 0, and the
    attaching process raise."""
    root = local_root
    runs_init = local.attach(root, idle_s=60, wait=False)  # (as `init` does: it comes up meanwhile)
    try:
        assert local.starting(root) and local.running_url(root) is None, "the server was up before the test attached"
        waited = local.attach(root, idle_s=60)
        try:
            assert waited.url == local.running_url(root) == runs_init.url()
            supervisors = local._processes(root, local._is_supervisor)
            assert len(supervisors) == 1, [p.info["cmdline"] for p in supervisors]
        finally:
            waited.release()
    finally:
        runs_init.release()
