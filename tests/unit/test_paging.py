"""The paging rules of a route (runledger.interop.paging), pure: a flapping alert within its cooldown goes
once, unless it gets worse; low-severity alerts wait for one digest; a page repeats until it is
acknowledged or resolved, and each message is released exactly when nothing more hangs on it. Then
the routes file's keys for them, and the ntfy and Pushover bodies."""

from __future__ import annotations

import json

import pytest

from runledger.interop.notify import request_body, request_headers
from runledger.interop.paging import Out, Pager
from runledger.interop.routes import Route, RoutesError, parse_routes

T0 = 1_800_000_000  # 2027-01-15T08:00:00Z


def stamp(s: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(T0 + s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def alert_event(n: int, alert_id: str, severity: str, at: float, state: str = "open", run: str = "r1") -> dict:
    return {"event_id": f"{run}:agent-x:0:{n}", "run_id": run, "producer": "agent-x", "kind": "alert", "step": n,
            "time": stamp(at), "payload": {"alert_id": alert_id, "agent": "agent-x", "rule": alert_id,
                                            "severity": severity, "state": state, "message": f"m{n}"}}


def ack_event(n: int, alert_id: str, at: float, run: str = "r1") -> dict:
    return {"event_id": f"{run}:notify:0:{n}", "run_id": run, "producer": "notify", "kind": "alert_ack", "step": None,
            "time": stamp(at), "payload": {"alert_id": alert_id, "by": "alice", "via": "webhook"}}


def sent_keys(outs: list[Out]) -> list[str]:
    return [o.key for o in outs]


def test_a_flapping_alert_goes_once_within_its_cooldown_unless_it_gets_worse():
    p = Pager(Route("r", "http://x/", cooldown_s=600))
    outs, rel = p.take(alert_event(0, "spike", "warn", 0), "m0", now=0)
    assert sent_keys(outs) == ["r1:agent-x:0:0"] and outs[0].releases == ["m0"] and rel == []
    for i, at in enumerate((60, 300, 599), start=1):  # the same alert, within 10 min: held back, its message done
        outs, rel = p.take(alert_event(i, "spike", "warn", at), f"m{i}", now=at)
        assert outs == [] and rel == [f"m{i}"]
    outs, _ = p.take(alert_event(4, "spike", "fail", 620), "m4", now=620)  # worse: it goes at once
    assert sent_keys(outs) == ["r1:agent-x:0:4"]
    outs, _ = p.take(alert_event(5, "spike", "warn", 700), "m5", now=700)  # milder than the last sent, within its cooldown
    assert outs == []
    outs, _ = p.take(alert_event(6, "spike", "warn", 1300), "m6", now=1300)  # past the cooldown of the last one sent
    assert sent_keys(outs) == ["r1:agent-x:0:6"]
    outs, _ = p.take(alert_event(7, "spike", "warn", 1310, state="resolved"), "m7", now=1310)  # a resolution always goes
    assert sent_keys(outs) == ["r1:agent-x:0:7"]
    outs, _ = p.take(alert_event(8, "spike", "warn", 1320), "m8", now=1320)  # and starts the alert afresh
    assert sent_keys(outs) == ["r1:agent-x:0:8"]
    outs, _ = p.take(alert_event(9, "other", "warn", 1321), "m9", now=1321)  # another alert_id has its own cooldown
    outs2, _ = p.take(alert_event(10, "spike", "warn", 1322, run="r2"), "m10", now=1322)  # so has another run's
    assert sent_keys(outs + outs2) == ["r1:agent-x:0:9", "r2:agent-x:0:10"]
    assert p.suppressed == 4


def test_without_a_cooldown_every_alert_goes():
    p = Pager(Route("r", "http://x/", digest_every_s=60))  # (a pager for its digest; no cooldown)
    assert [len(p.take(alert_event(i, "spike", "warn", i), i, now=i)[0]) for i in range(3)] == [1, 1, 1]


def test_low_severity_alerts_wait_for_one_digest_and_are_released_with_it():
    p = Pager(Route("r", "http://x/", digest_every_s=900))
    for i in range(5):
        outs, rel = p.take(alert_event(i, f"info-{i}", "info", i * 10), f"m{i}", now=100 + i * 10)
        assert outs == [] and rel == []
    outs, _ = p.take(alert_event(5, "bad", "fail", 50), "m5", now=150)  # (a fail does not wait)
    assert sent_keys(outs) == ["r1:agent-x:0:5"]
    assert p.next_due() == 1000
    assert p.due(999) == ([], [])
    outs, rel = p.due(1000)
    assert len(outs) == 1 and outs[0].digest and outs[0].key == "digest:r:r1:agent-x:0:0"
    assert [e["event_id"] for e in outs[0].envs] == [f"r1:agent-x:0:{i}" for i in range(5)]
    assert outs[0].releases == [f"m{i}" for i in range(5)] and rel == []
    assert p.due(5000) == ([], []) and p.next_due() is None  # nothing left: no empty digest


def test_a_page_repeats_until_acknowledged_then_stops_and_its_messages_are_released():
    p = Pager(Route("r", "http://x/", repeat_every_s=300))
    outs, rel = p.take(alert_event(0, "down", "fail", 0), "page", now=0)
    assert sent_keys(outs) == ["r1:agent-x:0:0"] and outs[0].releases == [] and rel == []  # held: it is a page
    outs, _ = p.take(alert_event(1, "slow", "warn", 1), "warn", now=1)  # a warn is not a page: sent and released
    assert outs[0].releases == ["warn"]
    assert p.due(299) == ([], [])
    outs, _ = p.due(300)
    assert sent_keys(outs) == ["r1:agent-x:0:0:repeat:1"] and outs[0].repeat == 1 and outs[0].releases == []
    outs, _ = p.due(600)
    assert sent_keys(outs) == ["r1:agent-x:0:0:repeat:2"]
    outs, rel = p.take(ack_event(0, "down", 650), "ack", now=650)
    assert outs == [] and rel == ["page", "ack"]  # the page and its acknowledgement, both done
    assert p.due(10_000) == ([], []) and p.next_due() is None


def test_a_resolution_stops_a_page_too():
    p = Pager(Route("r", "http://x/", repeat_every_s=60))
    p.take(alert_event(0, "down", "fail", 0), "page", now=0)
    outs, rel = p.take(alert_event(1, "down", "fail", 30, state="resolved"), "resolved", now=30)
    assert sent_keys(outs) == ["r1:agent-x:0:1"] and outs[0].releases == ["resolved"] and rel == ["page"]
    assert p.due(1000) == ([], [])


def test_an_acknowledgement_that_comes_before_its_page_stops_it_and_is_held_a_while():
    """After a restart JetStream gives the held page back only after ack_wait, while a new
    acknowledgement comes at once: the page, older than it, is not paged again."""
    p = Pager(Route("r", "http://x/", repeat_every_s=60), ack_wait_s=10)
    outs, rel = p.take(ack_event(0, "down", 100), "ack", now=0)
    assert outs == [] and rel == []  # held: its page may yet come
    outs, rel = p.take(alert_event(0, "down", "fail", 50), "page", now=5)
    assert outs == [] and rel == ["page"]
    assert p.due(29) == ([], [])
    assert p.due(30) == ([], ["ack"])  # ACK_GRACE ack_waits later, let go
    outs, _ = p.take(alert_event(1, "down", "fail", 200), "later", now=40)  # a new occurrence after it pages again
    assert sent_keys(outs) == ["r1:agent-x:0:1"]


def test_an_acknowledgement_of_another_alert_or_run_stops_nothing():
    p = Pager(Route("r", "http://x/", repeat_every_s=60))
    p.take(alert_event(0, "down", "fail", 0), "page", now=0)
    p.take(ack_event(0, "other", 1), "a1", now=1)
    p.take(ack_event(1, "down", 1, run="r2"), "a2", now=1)
    assert sent_keys(p.due(60)[0]) == ["r1:agent-x:0:0:repeat:1"]


# ------------------------------------------------------------------------------------ the routes file


def test_a_route_with_each_rule_reads_from_the_file():
    (r,) = parse_routes("""
[[route]]
name = "oncall"
url = "https://api.pushover.net/1/messages.json"
format = "pushover"
cooldown_s = 600
digest_every_s = 900
digest_severity = ["info", "warn"]
repeat_every_s = 300
params = { token = "env:PO_TOKEN", user = "env:PO_USER" }
""", env={"PO_TOKEN": "tok", "PO_USER": "usr"})
    assert (r.cooldown_s, r.digest_every_s, r.repeat_every_s, r.digest_severity) == (600, 900, 300, ("info", "warn"))
    assert r.params == {"token": "tok", "user": "usr"} and r.pages


@pytest.mark.parametrize("bad, reason", [
    ('cooldown_s = -1', "cooldown_s -1 is not a number of seconds"),
    ('repeat_every_s = "5m"', "repeat_every_s '5m' is not a number"),
    ('digest_severity = ["low"]', "digest_severity 'low' is not one of info, warn, fail"),
    ('format = "pushover"', "a pushover route needs params.token and params.user"),
    ('params = { token = "env:NOPE" }', r"params.token names \$NOPE, which is not set"),
])
def test_bad_paging_keys_are_refused_with_a_reason(bad, reason):
    with pytest.raises(RoutesError, match=reason):
        parse_routes(f'[[route]]\nname = "x"\nurl = "http://127.0.0.1:1/"\n{bad}\n', env={})


# ------------------------------------------------------------------------------------ ntfy and pushover


def test_ntfy_gets_the_text_and_a_title_priority_and_tags_in_headers():
    route = Route("n", "https://ntfy.sh/runledger-test", format="ntfy")
    page = Out("r1:agent-x:0:0:repeat:2", [alert_event(0, "down", "fail", 0)], repeat=2)
    body, headers = request_body(route, page).decode(), request_headers(route, page.key, page)
    assert body.startswith("[REPEAT 2] [FAIL] r1: down: m0")
    assert headers["Title"] == "[REPEAT 2] [FAIL] r1: down" and headers["Priority"] == "5"
    assert headers["Idempotency-Key"] == page.key and "rotating_light" in headers["Tags"]
    digest = Out("digest:n:x", [alert_event(1, "a", "info", 0), alert_event(2, "ü", "info", 1)], digest=True)
    headers = request_headers(route, digest.key, digest)
    assert headers["Title"] == "[DIGEST] 2 alerts (n)" and headers["Priority"] == "3"
    assert request_body(route, digest).decode().count("\n") == 1
    assert request_headers(route, "k", Out("k", [alert_event(3, "é", "warn", 0)]))["Title"].startswith("=?UTF-8?B?")


def test_pushover_gets_its_token_user_title_message_and_priority():
    route = Route("p", "https://api.pushover.net/1/messages.json", format="pushover",
                  params={"token": "tok", "user": "usr"})
    body = json.loads(request_body(route, Out("k", [alert_event(0, "down", "fail", 0)])))
    assert body == {"token": "tok", "user": "usr", "title": "[FAIL] r1: down", "priority": 1,
                    "message": "[FAIL] r1: down: m0 (agent-x, step 0)"}
    long = alert_event(1, "x" * 300, "info", 0)
    long["payload"]["message"] = "y" * 5000
    body = json.loads(request_body(route, Out("k", [long])))
    assert len(body["title"]) == 250 and len(body["message"]) == 1024 and body["priority"] == -1
