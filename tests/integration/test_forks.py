"""A user's own loop forks and rewinds (issue 42), through the embedded local server and ledger: a run
logs and saves a checkpoint; `init(fork_from="main?_step=20")` starts a fork that logs on from step 21;
`init(resume_from="fork?_step=30")` rewinds the fork as its next attempt. SQL (`steps`, `metrics`,
`metric(name)`) shows the spliced history,
`verify` exits 0, the parent's stored events are the same before and after, the fork's parent is the one
the trainer's `--fork-from main@20` would record, and the fork audit tells a matching fork from a worse one.
"""

from __future__ import annotations

import json

import pytest

import runledger
from runledger.queries.forks import checkpoint_point
from runledger.tools.cli import main as runledger_main
from support.reading import reader


def falling_loss(k: int) -> float:
    return 3.0 - 0.01 * k


def parent_events(root) -> list[tuple]:
    return reader(root).execute("select event_id, hash, stream_seq from events where run_id = 'main' "
                                "order by producer, attempt, seq").fetchall()


def test_a_users_loop_forks_and_rewinds_and_the_ledger_shows_the_spliced_history(local_root, tmp_path, capsys):
    ckpt = tmp_path / "ckpt-20.bin"
    ckpt.write_bytes(b"weights at step 20")
    with runledger.init(project="cutover", id="main", system_metrics=False) as run:
        for k in range(40):
            run.log({"loss": falling_loss(k), "mfu": 0.4, "grad_norm": 0.3}, step=k)
            if k == 20:
                run.log_checkpoint(ckpt, step=20)
    before = parent_events(local_root)

    with runledger.init(project="cutover", id="fork", fork_from="main?_step=20", system_metrics=False) as fork:
        assert fork.step == 21  # it logs on from the step after the fork point
        for k in range(21, 40):
            runledger.log({"loss": falling_loss(k), "mfu": 0.4, "grad_norm": 0.3})
    with runledger.init(project="cutover", resume_from="fork?_step=30", system_metrics=False) as again:
        assert (again.run_id, again.attempt, again.step) == ("fork", 1, 31)
        for k in range(31, 35):
            runledger.log({"loss": falling_loss(k) - 0.5, "mfu": 0.4, "grad_norm": 0.3})

    db = reader(local_root)
    rows = db.execute("select step, from_run, attempt, loss from steps where run_id = 'fork' order by step").fetchall()
    assert [r[0] for r in rows] == list(range(35))  # main's 0..20, the fork's 21..30, its rewind's 31..34
    assert [(r[1], r[2]) for r in rows] == [("main", 0)] * 21 + [("fork", 0)] * 10 + [("fork", 1)] * 4
    assert [r[3] for r in rows[31:]] == pytest.approx([falling_loss(k) - 0.5 for k in range(31, 35)])
    # the metrics alike (metric(name), metrics): the parent's up to the fork step, the fork's own after
    metric = db.execute("select step, attempt, value from metric('mfu') where run_id = 'fork' order by step").fetchall()
    assert [m[0] for m in metric] == list(range(35)) and [m[1] for m in metric] == [0] * 31 + [1] * 4
    assert db.execute("select count(*) from metrics where run_id = 'fork' and key = 'grad_norm'").fetchone()[0] == 35
    assert db.execute("select count(*) from metrics where run_id = 'main' and key = 'loss'").fetchone()[0] == 40
    starts = dict(db.execute("select attempt, coalesce(parent, rewind) from runs where run_id = 'fork'").fetchall())
    parent, rewind = json.loads(starts[0]), json.loads(starts[1])
    # the same parent as `runledger train --fork-from main@20` records from main's checkpoint at 20
    assert parent == checkpoint_point(local_root, "main", 20, str(ckpt.resolve()), parent["content_hash"])
    assert parent["run_id"] == "main" and parent["step"] == 20 and parent["attempt"] == 0
    assert parent["event_id"] == db.execute("select event_id from steps_all where run_id = 'main' and step = 20").fetchone()[0]
    assert rewind["run_id"] == "fork" and rewind["step"] == 30 and rewind["attempt"] == 0

    assert parent_events(local_root) == before  # the parent is unchanged
    assert runledger_main(["verify", "--root", str(local_root)]) == 0

    assert runledger_main(["audit", "fork", "fork", "--root", str(local_root)]) == 0  # (its rewind logs a lower loss)
    with runledger.init(project="cutover", id="same", fork_from="main@20", system_metrics=False):
        for k in range(21, 40):
            runledger.log({"loss": falling_loss(k), "mfu": 0.4, "grad_norm": 0.3})
    with runledger.init(project="cutover", id="worse", fork_from="main?_step=20", system_metrics=False):
        for k in range(21, 40):
            runledger.log({"loss": falling_loss(k) + 0.05, "mfu": 0.4, "grad_norm": 0.3})
    capsys.readouterr()
    assert runledger_main(["audit", "fork", "same", "--root", str(local_root)]) == 0
    capsys.readouterr()
    assert runledger_main(["audit", "fork", "worse", "--root", str(local_root), "--format", "json"]) == 1
    worse = {r["check"]: r for r in json.loads(capsys.readouterr().out)}
    assert worse["fork_loss"]["status"] == "fail" and worse["fork_loss"]["value"] == pytest.approx(0.05)
    assert json.loads(worse["fork_loss"]["evidence"])["window"] == "steps 21..39"


def test_a_fork_or_rewind_the_ledger_cannot_place_is_one_line_refused_before_anything_starts(local_root):
    with runledger.init(project="cutover", id="short", system_metrics=False) as run:
        for k in range(5):
            run.log({"loss": falling_loss(k)}, step=k)
    for kwargs, says in (({"fork_from": "ghost?_step=3"}, "no run 'ghost'"),
                         ({"fork_from": "short?_step=9"}, "steps up to 4: step 9 is past its last"),
                         ({"fork_from": "short"}, r"RUN\?_step=N or RUN@STEP"),
                         ({"resume_from": "short?_step=7"}, "step 7 is past its last")):
        with pytest.raises(runledger.LogError, match=says) as err:
            runledger.init(project="cutover", system_metrics=False, **kwargs)
        assert "\n" not in str(err.value)
    n = reader(local_root).execute("select count(distinct run_id), count(distinct attempt) from runs").fetchone()
    assert n == (1, 1)  # nothing started
