"""Agents and the worker end to end, with real NATS, the real ledger and a real (tiny) training run.

1. A run made slow in its first quarter gets its token horizon shortened by the throughput agent;
   the worker applies it at a step boundary; replay shows the new horizon; the LR health check
   passes after the retime; the decision trail shows decision → evidence → applied.
2. A run with planted high token drops (capacity factors far too small) gets set_capacity_factor
   (or set_dispatch), and the drop fraction after it is lower — all read back from the ledger.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runledger.ledger.check.replay import replay_run
from runledger.queries.audit import run_suite
from support import REPO
from support.reading import reader, wait_for_count

TINY_TOKENS_PER_STEP = 512


def start(*args, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
def agents_process(tmp_path, nats_server, root, ledger_process):
    ledger_process.start()
    procs = []

    def run(run_id):
        p = start("agents", "--root", str(root), "--nats", nats_server.url, "--run-id", run_id,
                  log=open(tmp_path / f"agents-{run_id}.log", "ab"))
        procs.append(p)
        return p

    yield run
    for p in procs:
        p.terminate()
        p.wait(30)


def train(tmp_path, root, url, run_id, *extra) -> int:
    log = open(tmp_path / f"train-{run_id}.log", "ab")
    p = start("train", "--preset", "tiny", "--run-id", run_id, "--root", str(root), "--nats", url, *extra, log=log)
    return p.wait(400)


def test_a_slow_first_quarter_shortens_the_horizon_and_the_worker_obeys(tmp_path, nats_server, root, agents_process):
    agents_process("slowrun")
    planned = TINY_TOKENS_PER_STEP / 0.2  # 5 steps/s planned; the slow node does ~1 step/s
    rc = train(tmp_path, root, nats_server.url, "slowrun", "--horizon-steps", "48", "--slow", "12:0.8",
               "--planned-tokens-per-s", str(planned), "--threshold", "window_steps=3")
    assert rc == 0, (tmp_path / "train-slowrun.log").read_text()[-3000:]
    assert wait_for_count(root, "select count(*) from runs_finished where run_id = 'slowrun'", 1) == 1
    con = reader(root)
    [(did, params, evidence)] = con.execute(
        "select decision_id, params, evidence from decisions where run_id = 'slowrun' and action = 'set_token_horizon'").fetchall()
    new_horizon = json.loads(params)["horizon_steps"]
    assert 1 < new_horizon < 48
    assert json.loads(evidence)["rows"][0]["recent_tokens_per_s"] < planned  # the evidence that caused it
    [(status, applied_at, reason)] = con.execute(
        "select status, step, reason from decisions_applied where decision_id = ?", [did]).fetchall()
    assert status == "applied" and applied_at < 12, (status, applied_at, reason, new_horizon)  # in the first quarter
    state = replay_run(root, "slowrun")
    assert state.schedule["horizon_steps"] == new_horizon
    assert con.execute("select max(step) from steps where run_id = 'slowrun'").fetchone()[0] == new_horizon
    health = {r["check"]: r for r in run_suite(root, "health", "slowrun").rows()}
    assert health["lr_schedule"]["status"] == "ok", health["lr_schedule"]
    trail = run_suite(root, "provenance", "slowrun")
    trail_rows = next(r for r in trail.results if r.name.endswith("decision_trail"))
    cols = trail_rows.columns
    rows = [dict(zip(cols, r)) for r in trail_rows.rows]
    assert any(r.get("decision_id") == did and r.get("applied_at_step") is not None for r in rows), rows


def test_planted_high_drops_get_a_capacity_decision_and_drop_less_after(tmp_path, nats_server, root, agents_process):
    agents_process("droprun")
    # A plan of one step per 10 s, which any machine beats: this test is about drops, and a slow CI
    # machine must not also earn a throughput decision (seen once: set_token_horizon at step 10).
    planned = TINY_TOKENS_PER_STEP / 10
    rc = train(tmp_path, root, nats_server.url, "droprun", "--horizon-steps", "40", "--set", "moe.cf_send=0.5",
               "--set", "moe.cf_recv=0.5", "--planned-tokens-per-s", str(planned), "--threshold", "window_steps=3")
    assert rc == 0, (tmp_path / "train-droprun.log").read_text()[-3000:]
    assert wait_for_count(root, "select count(*) from runs_finished where run_id = 'droprun'", 1) == 1
    con = reader(root)
    applied = con.execute("""select a.step, d.action from decisions_applied a join decisions d using (decision_id)
                             where a.run_id = 'droprun' and a.status = 'applied' order by a.step""").fetchall()
    assert applied and all(a in ("set_capacity_factor", "set_dispatch") for _, a in applied), applied
    first = applied[0][0]
    before, after = con.execute(f"""select avg(drop_fraction) filter (where step <= {first}),
                                           avg(drop_fraction) filter (where step > {first})
                                    from drops where run_id = 'droprun'""").fetchone()
    assert after < before, (before, after)
