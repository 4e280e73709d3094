"""`runledger mcp`'s tools through the `mcp` package's own client (in-process): runs, every point of a history in
pages, SQL under the console's guard and bounds (no write, no read of the server's files), and a proposal that
can never be a review. Every refusal is an error result of one line."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("mcp")  # (the [mcp] extra; dev brings it)

from mcp import Client  # noqa: E402

from runledger.tools.mcp_server import Reads, build, producer_of  # noqa: E402
from runledger.ui.console import MAX_SQL_ROWS  # noqa: E402
from support.runs import RUN, build_run  # noqa: E402

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

TOOLS = {"list_runs", "history", "sql", "health", "decisions", "evidence", "propose_decision"}


def calls(root, *steps, producer="agent-scout"):
    """Call each (tool, arguments) in turn on one session; the results as (is_error, text)."""
    async def go():
        out = []
        async with Client(build(Reads(root, producer, None))) as client:
            out.append((False, sorted(t.name for t in (await client.list_tools()).tools)))
            for name, args in steps:
                res = await client.call_tool(name, args)
                text = json.dumps(res.structured_content["result"]) if name == "list_runs" and not res.is_error \
                    else res.content[0].text  # (a list comes back as one content item per element)
                out.append((res.is_error, text))
        return out

    return asyncio.run(go())


@pytest.fixture
def run_root(root):
    build_run(root)
    return root


def test_an_agent_reads_runs_and_every_point_a_page_at_a_time(run_root):
    (_, tools), (err, runs), *pages = calls(run_root, ("list_runs", {}),
                                            ("history", {"run": RUN, "keys": ["train/loss"], "limit": 3}))
    assert set(tools) == TOOLS and not err and json.loads(runs)[0]["run_id"] == RUN
    # run-1 logs typed steps only (runledger's trainer), so its metrics history names no key: a one-line refusal
    assert pages[0][0] and "logged no 'train/loss'" in pages[0][1] and "\n" not in pages[0][1]


def test_history_pages_put_together_are_every_point(root):
    from support.audit_ledger import T0, Ledger

    led = Ledger(root)
    led.emit("m", "run_started", {"config": {}, "config_hash": "c", "token_budget": 1, "schedule": {}}, 0, T0)
    for k in range(25):
        led.emit("m", "metrics", {"metrics": {"loss": 1 / (k + 1)}}, k, T0)
    led.emit("o", "run_started", {"config": {}, "config_hash": "c", "token_budget": 1, "schedule": {}}, 0, T0)
    led.emit("o", "metrics", {"metrics": {"loss": 9.0}}, 0, T0)
    led.write()

    async def go():
        got, cursor = [], None
        async with Client(build(Reads(root, "agent-scout", None))) as client:
            while True:
                res = await client.call_tool("history", {"run": "m", "keys": ["loss"], "limit": 10,
                                                         **({"cursor": cursor} if cursor else {})})
                page = json.loads(res.content[0].text)
                got += page["columns"]["loss"]
                if not (cursor := page["cursor"]):
                    break
            first = await client.call_tool("history", {"run": "m", "keys": ["loss"], "limit": 10})
            cursor = json.loads(first.content[0].text)["cursor"]
            other = await client.call_tool("history", {"run": "o", "keys": ["loss"], "cursor": cursor})
            too_many = await client.call_tool("history", {"run": "m", "limit": 10_001})
        return got, other, too_many

    got, other, too_many = asyncio.run(go())
    assert got == [1 / (k + 1) for k in range(25)]
    assert other.is_error and "this cursor is of run 'm', not of 'o'" in other.content[0].text
    assert too_many.is_error and "limit is a number of rows from 1 to 10000" in too_many.content[0].text


def test_sql_keeps_the_consoles_guard_and_bounds(run_root):
    secret = run_root / "nats" / "auth.conf"
    secret.parent.mkdir()
    secret.write_text("password: hunter2\n")
    _, (ok_err, ok), (w_err, write), (n_err, nats), (b_err, big) = calls(
        run_root, ("sql", {"query": "select count(*) as n from steps"}),
        ("sql", {"query": "create table t as select 1"}),
        ("sql", {"query": f"select * from read_text('{secret}')"}),
        ("sql", {"query": "select range from range(20000)"}))
    assert not ok_err and json.loads(ok)["rows"] == [[10]]
    assert w_err and "only queries are allowed here, not CREATE" in write
    assert n_err and "hunter2" not in nats and ("Permission" in nats or "not allowed" in nats or "disabled" in nats), nats
    assert not b_err and json.loads(big)["total"] == MAX_SQL_ROWS and json.loads(big)["truncated"] is True


@pytest.mark.parametrize("args, reason", [
    ({"run": RUN, "action": "approve", "params": {"decision_id": "d1"}, "rationale": "mine"}, "'approve' is a person's review"),
    ({"run": RUN, "action": "reject", "params": {"decision_id": "d1"}, "rationale": "no"}, "'reject' is a person's review"),
    ({"run": RUN, "action": "launch", "rationale": "x"}, "unknown action 'launch'"),
    ({"run": RUN, "action": "set_token_horizon", "params": {"horizon_tokens": "soon"}, "rationale": "x"},
     "params do not fit set_token_horizon"),
    ({"run": "nope", "action": "checkpoint_now", "rationale": "x"}, "no run has the id or name 'nope'"),
    ({"run": RUN, "action": "checkpoint_now", "rationale": ""}, "rationale is text of 1 to"),
    ({"run": RUN, "action": "checkpoint_now", "rationale": "x"}, "no NATS server to send the proposal to"),
])
def test_a_proposal_is_never_a_review_and_bad_input_is_one_line(run_root, args, reason):
    _, (err, text) = calls(run_root, ("propose_decision", args))
    assert err and reason in text and "\n" not in text


def test_decisions_and_evidence(run_root):
    _, (err, decisions), (e_err, evidence) = calls(run_root, ("decisions", {"run": RUN}), ("evidence", {"alert": "none"}))
    assert not err and json.loads(decisions)["decisions"]["d1"]["status"] in ("approved", "applied")
    assert e_err and "no alert 'none'" in evidence


def test_the_proposer_is_the_servers_agent():
    assert producer_of("scout") == producer_of("agent-scout") == "agent-scout"
    with pytest.raises(ValueError, match="is not a name"):
        producer_of("Scout!")


@pytest.mark.parametrize("args, reason", [
    (["--agent", "Scout!"], "--agent 'Scout!' is not a name"),
    (["--http", "--host", "0.0.0.0"], "--host 0.0.0.0 is not loopback: give --token-file"),
])
def test_bad_mcp_options_are_one_line(run_root, args, reason):
    from support.processes import cli

    done = cli("mcp", "--root", str(run_root), *args)
    assert done.returncode == 2 and reason in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_token_file_holds_a_long_token(tmp_path):
    from runledger.tools.args import UsageError
    from runledger.tools.mcp_server import read_token

    (tmp_path / "t.json").write_text(json.dumps({"token": "k" * 20}))
    (tmp_path / "short").write_text("abc\n")
    assert read_token(str(tmp_path / "t.json")) == "k" * 20
    with pytest.raises(UsageError, match="a token of at least 16 characters"):
        read_token(str(tmp_path / "short"))


def test_an_alerts_evidence_and_a_runs_health(root):
    from support.audit_ledger import T0, Ledger

    led = Ledger(root)
    led.emit("r", "run_started", {"config": {}, "config_hash": "c", "token_budget": 1, "schedule": {}}, 0, T0)
    led.emit("r", "alert", {"alert_id": "agent-x:r:slow:1", "agent": "agent-x", "rule": "slow", "message": "slow steps",
                            "evidence": {"rows": [{"step": 3, "step_time_s": 9.5}]}}, 3, T0, producer="agent-x")
    led.write()
    _, (err, evidence), (h_err, health) = calls(root, ("evidence", {"alert": "agent-x:r:slow:1"}), ("health", {"run": "r"}))
    assert not err and json.loads(evidence)["evidence"] == {"rows": [{"step": 3, "step_time_s": 9.5}]}
    assert json.loads(evidence)["producer"] == "agent-x" and json.loads(evidence)["message"] == "slow steps"
    checks = json.loads(health)["checks"]
    assert not h_err and checks and {"config_match", "grad_norm_max", "drop_fraction"} <= {c["check"] for c in checks}
