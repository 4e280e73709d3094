"""`runledger notify` and the stall alert: every alert and decision reaches its webhooks at least once,
through a receiver that fails, goes away and comes back, and a notify killed mid-delivery; a run
that pauses gets a `stalled` alert, then its resolution.

The receiver is a real HTTP server on a free loopback port that dedupes by the Idempotency-Key, as
the issue asks of receivers; NATS, the ledger and DuckDB are the real ones.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from runledger.agents import stall
from runledger.agents.runner import evaluate, recent_runs
from runledger.interop.notify import BACKOFF_BASE_S, BACKOFF_CAP_S, backoff_s, json_body, request_body, slack_body
from runledger.interop.routes import Route, RoutesError, parse_routes
from runledger.ledger.emit.sealing import seal
from support.audit_ledger import T0, Ledger
from support.processes import cli
from support.webhooks import alert, decision

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

STEP = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.05}
START = {"config": {}, "config_hash": "0" * 64, "token_budget": None}  # (replay reads token_budget as a key)


# ------------------------------------------------------------------------------------ the receiver


# ------------------------------------------------------------------------------------ pure parts


def test_routes_take_what_they_name_and_refuse_what_they_do_not_know():
    [everything, oncall] = parse_routes("""
[[route]]
name = "everything"
url = "http://127.0.0.1:1/json"
[[route]]
name = "oncall"
url = "https://hooks.example/slack"
format = "slack"
severity = ["fail"]
agents = ["agent-*"]
runs = ["prod-*"]
""")
    env = {"kind": "alert", "run_id": "prod-7", "producer": "agent-x",
           "payload": {"severity": "fail", "agent": "agent-drops"}}
    assert everything.matches(env) and oncall.matches(env)
    assert not oncall.matches({**env, "run_id": "dev-1"})
    assert not oncall.matches({**env, "payload": {"severity": "warn", "agent": "agent-drops"}})
    assert not oncall.matches({**env, "payload": {"severity": "fail", "agent": "person:ann"}})
    decided = {"kind": "decision", "run_id": "prod-7", "producer": "agent-x", "payload": {"agent": "agent-drops"}}
    assert oncall.matches(decided)  # a decision has no severity: the severity condition is the alerts'
    assert not Route("r", "http://x/", kinds=("alert",)).matches(decided)
    for bad, reason in (('[[route]]\nname="a"\nurl="http://x/"\nseverty=["fail"]', "unknown key 'severty'"),
                        ('[[route]]\nname="a"\nurl="ftp://x/"', "not an http(s) URL"),
                        ('[[route]]\nname="a"\nurl="http://x/"\nformat="teams"', "format 'teams'"),
                        ('[[route]]\nname="a"\nurl="http://x/"\nseverity=["page"]', "severity 'page'"),
                        ('[[route]]\nname="a"\nurl="http://x/"\n[[route]]\nname="a"\nurl="http://y/"', "used twice"),
                        ('[[route]]\nname="a"\nurl="http://x/"\nheaders={A="env:NOPE_UNSET"}', "$NOPE_UNSET"),
                        ("", "no routes")):
        with pytest.raises(RoutesError, match=reason.replace("(", r"\(").replace(")", r"\)").replace("$", r"\$")):
            parse_routes(bad, env={})
    [r] = parse_routes('[[route]]\nname="a"\nurl="http://x/"\nheaders={Authorization="env:TOKEN"}', env={"TOKEN": "t"})
    assert r.headers == {"Authorization": "t"}
    [j] = parse_routes('{"route": [{"name": "a", "url": "http://x/", "format": "slack", "runs": "prod-*"}]}', ".json")
    assert (j.format, j.runs, j.kinds) == ("slack", ("prod-*",), ("alert", "decision"))


def test_notify_refuses_a_bad_routes_file_with_a_reason(tmp_path):
    bad = tmp_path / "routes.toml"
    bad.write_text('[[route]]\nname = "a"\nurl = "http://127.0.0.1:1/"\nformat = "teams"\n')
    done = cli("notify", "--routes", str(bad), "--nats", "nats://127.0.0.1:1")
    assert done.returncode == 2 and "format 'teams' is not one of slack, json" in done.stderr


def test_payloads_carry_the_event_id_and_say_what_happened():
    env, _ = seal("r1", "agent-test", 0, 0, "alert", alert(1, "fail"), 5, "")
    slack = slack_body(env)
    assert set(slack) == {"text", "blocks"}
    assert slack["text"].startswith("[FAIL] r1: test_rule: alert &lt;1&gt; &amp; more")  # Slack's escaping
    assert env["event_id"] in slack["blocks"][1]["elements"][0]["text"]
    generic = json_body(env)
    assert generic["event"] == env and generic["idempotency_key"] == env["event_id"]
    assert json.loads(request_body(Route("j", "http://x/"), env)) == json.loads(json.dumps(generic))
    resolved, _ = seal("r1", "agent-test", 0, 1, "alert", alert(1, "fail", "resolved"), 6, env["hash"])
    assert json_body(resolved)["summary"].startswith("[RESOLVED] r1: test_rule")
    made, _ = seal("r1", "agent-test", 0, 2, "decision", decision(1), 6, resolved["hash"])
    assert json_body(made)["summary"].startswith("[DECISION] r1: checkpoint_now {}: decision 1")


def test_backoff_doubles_up_to_its_cap_with_jitter():
    import random

    rng = random.Random(0)
    for n in range(1, 20):
        full = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (n - 1))
        waits = [backoff_s(n, rng) for _ in range(50)]
        assert all(full / 2 <= w <= full for w in waits)
        assert len(set(waits)) > 1  # jittered
    assert backoff_s(1000, rng) <= BACKOFF_CAP_S


def stalled_run(root: Path, *, gap_s: float = 1.0, steps: int = 30, alert_open: bool = False, after: int = 0,
                finished: bool = False) -> None:
    """A run whose steps came `gap_s` apart, long ago (so it is silent now); with `alert_open`, a stall
    alert recorded after them, and `after` steps after that."""
    led = Ledger(root)
    led.emit("r", "run_started", START, 0, T0)
    t = T0
    for k in range(1, steps + 1):
        t += timedelta(seconds=gap_s)
        led.emit("r", "step", STEP, k, t)
    led.write()  # (stream order: the steps, then the alert)
    if alert_open:
        led.emit("r", "alert", {"alert_id": f"{stall.NAME}:r:stalled:{steps}", "agent": stall.NAME, "rule": "stalled",
                                "message": "stalled"}, steps, t, producer=stall.NAME)
        led.write()
    for k in range(steps + 1, steps + 1 + after):
        t += timedelta(seconds=gap_s)
        led.emit("r", "step", STEP, k, t)
    if finished:
        led.emit("r", "run_finished", {"status": "completed"}, steps + after, t)
    led.write()


def test_the_stall_agent_opens_on_silence_and_resolves_when_steps_come_back(tmp_path):
    stalled_run(tmp_path / "silent")
    _, [(agent, opened)] = evaluate(tmp_path / "silent", "r", agents=(stall,))
    assert (agent, opened.kind, opened.rule, opened.state) == (stall.NAME, "alert", "stalled", "open")
    assert opened.id == f"{stall.NAME}:r:stalled:30" and opened.evidence["rows"][0]["median_gap_s"] == pytest.approx(1.0)

    stalled_run(tmp_path / "still", alert_open=True)  # still silent, alert open: nothing new
    assert evaluate(tmp_path / "still", "r", agents=(stall,))[1] == []

    stalled_run(tmp_path / "back", alert_open=True, after=3)
    _, [(_, resolved)] = evaluate(tmp_path / "back", "r", agents=(stall,))
    assert (resolved.id, resolved.state, resolved.key) == (opened.id, "resolved", opened.id + ":resolved")
    assert resolved.event(stall.NAME).state == "resolved"

    stalled_run(tmp_path / "done", alert_open=True, finished=True)  # it ended: the stall is over too
    assert [a.state for _, a in evaluate(tmp_path / "done", "r", agents=(stall,))[1]] == ["resolved"]
    stalled_run(tmp_path / "finished", finished=True)  # a finished run is not stalled
    assert evaluate(tmp_path / "finished", "r", agents=(stall,))[1] == []


def test_restarted_agents_watch_the_unfinished_runs_heard_from_lately(tmp_path):
    """A run that went silent before the agents (re)started sends nothing to wake them: they watch the
    recent unfinished runs from the start (runledger.agents.runner.recent_runs)."""
    led = Ledger(tmp_path)
    now = datetime.now(timezone.utc)
    for run_id, at, finished in (("silent", now - timedelta(minutes=5), False), ("done", now, True),
                                 ("ancient", now - timedelta(days=30), False)):
        led.emit(run_id, "run_started", START, 0, at)
        led.emit(run_id, "step", STEP, 1, at)
        if finished:
            led.emit(run_id, "run_finished", {"status": "completed"}, 1, at)
    led.write()
    assert recent_runs(tmp_path) == {"silent"}
    assert recent_runs(tmp_path / "nothing-yet") == set()
