"""The read side attacked: an MCP agent's `sql` after the server's passwords (`nats up --secure`'s users and
credentials, by every path DuckDB knows), a write or a setting through it, a proposal that claims another agent's
name or approves; a history cursor forged for another run; the dashboard's history read without its token.
Each promise is asserted, not the one input that once broke it."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402

from attacks.test_attacks_cli import passwords, secure_root  # noqa: E402,F401  (the fixture: a real `nats up --secure`)
from runledger.queries import history  # noqa: E402
from runledger.tools.mcp_server import Reads, build  # noqa: E402
from support.runs import RUN, build_run  # noqa: E402
from support.ui import client  # noqa: E402


def call_all(root, steps, producer="agent-scout"):
    async def go():
        async with Client(build(Reads(root, producer, None))) as c:
            return [await c.call_tool(name, args) for name, args in steps]

    return asyncio.run(go())


def test_an_agents_sql_never_reads_the_servers_files(secure_root):  # noqa: F811
    root, _ = secure_root
    build_run(root)
    nats_dir = (root / "nats").resolve()
    attempts = [f"select content from read_text('{nats_dir}/users.json')",
                f"select content from read_text('{nats_dir}/creds/agent.creds')",
                f"select content from read_text('{root.resolve()}/events/../nats/nats-server.conf')",
                f"select * from read_csv('{nats_dir}/users.json', header=false, sep='\\x01')",
                f"select * from glob('{nats_dir}/creds/*')",
                f"select * from read_parquet('{nats_dir}/**/*')",
                "select content from read_text('/etc/passwd')"]
    results = call_all(root, [("sql", {"query": q}) for q in attempts])
    secrets = passwords(root)
    for query, res in zip(attempts, results):
        text = res.content[0].text
        assert res.is_error, (query, text)
        assert not any(pw in text for pw in secrets), query
        assert "agent.creds" in query or "agent.creds" not in text, query  # (no listing of the folder either)
        assert "\n" not in text, query


@pytest.mark.parametrize("query", [
    "create table t as select 1", "insert into runs select * from runs", "drop view steps", "attach 'x.db' as x",
    "copy (select 1) to '/tmp/x.csv'", "set enable_external_access = true", "install httpfs", "load httpfs",
    "select 1; drop view steps", "pragma enable_profiling",
])
def test_an_agents_sql_is_a_query_and_nothing_else(root, query):
    build_run(root)
    (res,) = call_all(root, [("sql", {"query": query})])
    assert res.is_error and "\n" not in res.content[0].text, query
    (after,) = call_all(root, [("sql", {"query": "select count(*) from steps"})])
    assert not after.is_error and json.loads(after.content[0].text)["rows"] == [[10]]


def test_an_agent_can_neither_approve_nor_speak_for_another(root):
    build_run(root)
    # d1 waits in run-1 for a review (support.runs.build_run); an agent asks for the review in every form it can
    approve, reject, named = call_all(root, [
        ("propose_decision", {"run": RUN, "action": "approve", "params": {"decision_id": "d1"}, "rationale": "ok"}),
        ("propose_decision", {"run": RUN, "action": "reject", "params": {"decision_id": "d1"}, "rationale": "no"}),
        ("propose_decision", {"run": RUN, "action": "checkpoint_now", "rationale": "now", "agent": "person:alice",
                              "producer": "cli", "mode": "auto"}),
    ])
    assert approve.is_error and "is a person's review" in approve.content[0].text
    assert reject.is_error and "is a person's review" in reject.content[0].text
    # (no NATS here: refused before anything is sent; the arguments it added changed nothing it would have sent)
    assert named.is_error and "no NATS server" in named.content[0].text


def test_a_cursor_forged_for_another_run_reads_nothing_of_it(root):
    from support.audit_ledger import T0, Ledger

    led = Ledger(root)
    for run in ("mine", "theirs"):
        led.emit(run, "run_started", {"config": {}, "config_hash": "c", "token_budget": 1, "schedule": {}}, 0, T0)
        for k in range(5):
            led.emit(run, "metrics", {"metrics": {"secret": float(k) if run == "theirs" else 0.0}}, k, T0)
    led.write()
    _, real = history.history(root, "theirs", ["secret"], limit=2)
    body = json.loads(base64.urlsafe_b64decode(real + "=" * (-len(real) % 4)))
    for forged in ({**body, "run": "mine"}, {**body, "after": [-10, "", -1, -1]}):
        text = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
        try:
            page, _ = history.history(root, "mine", ["secret"], after=text, limit=10)
        except history.BadCursor:
            continue
        assert set(page.column("secret").to_pylist()) == {0.0}  # only ever the asked run's own points
    with pytest.raises(history.BadCursor):
        history.history(root, "mine", ["secret"], after=real, limit=10)


def test_the_dashboards_history_needs_its_token(root):
    build_run(root)
    token = "t" * 24
    page = client(root, "0.0.0.0", read_token=token)  # not loopback: every request needs the token
    for headers in ({}, {"authorization": "Bearer " + "u" * 24}, {"x-runledger-token": ""}):
        for path in ("/api/history?run=run-1", "/api/history/runs"):
            r = page.get(path, headers=headers)
            assert r.status_code == 401 and RUN not in r.text, (path, headers)
