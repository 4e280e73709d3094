"""A W&B or Trackio user's scripts, run again: the most ordinary thing a user does.

Scripts in the spirit of Trackio's `examples/grouped-runs.py` and `examples/fake-training.py` (several
named runs, a group each, `init` again without `finish` between runs) and of W&B's quickstart, with only
the import changed (`import runledger as trackio`, `import runledger as wandb`), are each run twice as
a user runs them, in child processes, with the same project and names. Every run of both is stored,
each under a fresh id, with its name; a command given a name that several runs have refuses it (exit 2),
listing them, and takes a name one run has; a run stored before names were kept reads its id as its name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import REPO
from support.processes import runledger
from support.reading import reader

GROUPED_RUNS = """
    import random

    import runledger as trackio

    random.seed(1)
    for group, factor in (("baseline", 0.9), ("augmented", 1.0), ("tuned", 1.15)):
        for index in (1, 2):
            trackio.init(project="grouped-runs-demo", name=f"{group}-run-{index}", group=group,
                         config={"learning_rate": random.choice([1e-3, 5e-4]), "batch_size": random.choice([16, 32])})
            for step in range(12):
                progress = step / 11
                loss = max(0.05, 1.5 / factor * (1.0 - 0.85 * progress) + random.uniform(-0.03, 0.03))
                trackio.log({"loss": round(loss, 4), "accuracy": round(0.5 + 0.45 * progress * factor, 4)}, step=step)
            trackio.finish()
"""

FAKE_TRAINING = """
    import math
    import random

    import runledger as trackio

    EPOCHS = 8
    for run in range(3):
        trackio.init(project="fake-training", name=f"test-run-{run}",  # no finish between: init ends the last run
                     config=dict(epochs=EPOCHS, learning_rate=0.001, batch_size=32, optimizer="Adam", run_number=run))
        for epoch in range(EPOCHS):
            progress = epoch / EPOCHS
            trackio.log({
                "train/loss": 2.5 * math.exp(-3 * progress) + random.uniform(0, 0.1),
                "train/accuracy": 0.9 / (1 + math.exp(-6 * (progress - 0.5))),
                "val/loss": 2.6 * math.exp(-3 * progress) + random.uniform(0, 0.1),
                "grad_norm": 50 * math.exp(-4 * progress) + 1.0,
            })
    trackio.finish()
"""

WANDB_QUICKSTART = """
    import random

    import runledger as wandb

    run = wandb.init(project="my-awesome-project",
                     config={"learning_rate": 0.02, "architecture": "CNN", "dataset": "CIFAR-100", "epochs": 10})
    epochs, offset = 10, random.random() / 5
    for epoch in range(2, epochs):
        acc = 1 - 2 ** -epoch - random.random() / epoch - offset
        loss = 2 ** -epoch + random.random() / epoch + offset
        run.log({"acc": acc, "loss": loss})
    run.finish()
"""


def run_twice(code: str, root: Path, tmp_path: Path) -> None:
    """The script run as a user runs it, then once more, as written (each from a file, in its own folder)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    env.update(RUNLEDGER_ROOT=str(root), PYTHONPATH=str(REPO))
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("code, project, names, steps", [
    (GROUPED_RUNS, "grouped-runs-demo", [f"{g}-run-{i}" for g in ("baseline", "augmented", "tuned") for i in (1, 2)], 12),
    (FAKE_TRAINING, "fake-training", [f"test-run-{i}" for i in range(3)], 8),
], ids=["trackio-grouped-runs", "trackio-fake-training"])
def test_a_trackio_example_runs_twice_and_both_runs_of_each_name_are_stored(local_root, tmp_path, code, project, names, steps):
    run_twice(code, local_root, tmp_path)
    db = reader(local_root)
    rows = db.execute("select run_id, name, project, \"group\" from runs").fetchall()
    by_name: dict[str, list[str]] = {}
    for run_id, name, proj, group in rows:
        assert proj == project
        assert group == (name.split("-run-")[0] if project == "grouped-runs-demo" else None)
        by_name.setdefault(name, []).append(run_id)
    assert sorted(by_name) == sorted(names)
    for name, ids in by_name.items():
        assert len(ids) == 2 and len(set(ids)) == 2, (name, ids)  # both runs, each its own id
    finished = db.execute("select status, count(*) from runs_finished group by status").fetchall()
    assert finished == [("completed", 2 * len(names))]
    per_run = db.execute("select run_id, count(distinct step) from metrics group by run_id").fetchall()
    assert sorted(n for _, n in per_run) == [steps] * (2 * len(names))
    assert runledger("verify", "--root", str(local_root)).returncode == 0


def test_the_wandb_quickstart_runs_twice_and_both_runs_are_stored(local_root, tmp_path):
    run_twice(WANDB_QUICKSTART, local_root, tmp_path)
    db = reader(local_root)
    rows = db.execute("select run_id, name, project, config from runs").fetchall()
    assert len(rows) == 2 and len({r[0] for r in rows}) == 2  # distinct ids
    for run_id, name, project, _config in rows:
        assert project == "my-awesome-project" and name == run_id  # no name given: the run is named by its id
        assert run_id.startswith("my-awesome-project-")
    counts = db.execute("select run_id, count(*) from metrics where key = 'acc' group by run_id").fetchall()
    assert sorted(n for _, n in counts) == [8, 8]


def test_a_command_takes_a_name_one_run_has_and_refuses_one_that_several_have_listing_them(local_root, tmp_path):
    import runledger as api

    ids = []
    for _ in range(2):
        run = api.init(project="names", name="twice", system_metrics=False)
        api.log({"loss": 1.0}, step=0)
        run.finish()
        ids.append(run.id)
    once = api.init(project="names", name="only once", system_metrics=False)
    api.log({"loss": 2.0}, step=0)
    once.finish()
    old = api.init(project="names", id="old-style", system_metrics=False)  # run_started without a name
    old.finish()
    root = str(local_root)

    for command in (["replay", "twice"], ["report", "twice", "--out", str(tmp_path / "r.html")],
                    ["audit", "health", "twice"], ["lineage", "twice"]):
        r = runledger(*command, "--root", root)
        assert r.returncode == 2, (command, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "ambiguous" in lines[0], (command, r.stderr)
        for run_id in ids:  # each candidate: its id, project and start
            assert run_id in lines[0]
        assert lines[0].count("project names, started ") == 2, lines[0]

    r = runledger("replay", "only once", "--root", root, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert f'"run_id": "{once.id}"' in r.stdout
    r = runledger("replay", ids[0], "--root", root, "--format", "json")  # an id is always one run
    assert r.returncode == 0 and f'"run_id": "{ids[0]}"' in r.stdout, r.stderr
    r = runledger("report", "only once", "--root", root, "--out", str(tmp_path / "once.html"))
    assert r.returncode == 0 and (tmp_path / "once.html").stat().st_size > 0, r.stderr
    r = runledger("replay", "nobody", "--root", root)
    assert r.returncode == 2 and "no events for run 'nobody'" in r.stderr, r.stderr

    # an old-style run (its run_started has no name) is named by its id, and found by it
    db = reader(local_root)
    assert db.execute("select name from run_names where run_id = 'old-style'").fetchall() == [("old-style",)]
    r = runledger("sql", "--root", root, "--format", "csv", "select run_id from runs where run_id = run_of('only once')")
    assert r.returncode == 0 and once.id in r.stdout, r.stderr
    r = runledger("sql", "--root", root, "select run_of('twice')")
    assert r.returncode == 2 and "ambiguous" in r.stderr
    r = runledger("replay", "old-style", "--root", root, "--format", "json")
    assert r.returncode == 0 and '"run_id": "old-style"' in r.stdout, r.stderr
