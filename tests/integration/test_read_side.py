"""The read side against a live ledger: an MCP client (the `mcp` package's own, over HTTP with the server's token)
lists runs, reads a history, is refused a write and a read of the server's files, and proposes a decision that the
dashboard then approves and the worker's decision feed hands out; a client claiming another agent's name is
recorded under the server's configured one; a wrong or missing token is refused. `runledger.Api(url=)` reads the
same history through the dashboard with its read token, and is refused without it. An export of the live root
verifies from its files alone."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("mcp")

import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp_types import Implementation  # noqa: E402

import runledger  # noqa: E402
from runledger.ledger.decisions.inbox import DecisionFeed  # noqa: E402
from runledger.ledger.emit.emitter import Emitter  # noqa: E402
from support import REPO  # noqa: E402
from support.processes import free_port, runledger as run_cli  # noqa: E402
from support.reading import wait_for_count  # noqa: E402
from support.ui import UiStack  # noqa: E402

RUN, STEPS = "reader-1", 300
MCP_TOKEN, READ_TOKEN, WRITE_TOKEN = "m" * 32, "r" * 32, "w" * 32


@pytest.fixture
def stack(tmp_path):
    s = UiStack(tmp_path)
    yield s
    s.stop()


def emit_reader_run(stack) -> None:
    em = Emitter(RUN, "worker-0", 0, stack.nats.url, stack.tmp / "spool")
    em.emit_dict("run_started", {"config": {"lr": 0.01}, "config_hash": "c", "token_budget": 10_000, "schedule": {},
                                 "project": "read", "name": "reader", "tags": ["mcp"]}, 0)
    for k in range(STEPS):
        em.emit_dict("metrics", {"metrics": {"train/loss": 10.0 / (k + 1), "lr": 1e-3}}, k)
    assert em.close(60)
    assert wait_for_count(stack.root, f"select count(*) from metric_events where run_id = '{RUN}'", STEPS) == STEPS


class McpProcess:
    """`runledger mcp --http` as a child process; `url` the address it printed."""

    def __init__(self, stack, *args: str):
        token_file = stack.tmp / "mcp-token.json"
        token_file.write_text(json.dumps({"token": MCP_TOKEN}))
        self.log = open(stack.tmp / "mcp.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "mcp", "--http", "--root", str(stack.root),
                                      "--nats", stack.nats.url, "--token-file", str(token_file), "--port", str(free_port()),
                                      *args], cwd=REPO, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), (stack.tmp / "mcp.log").read_text()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.proc.stdout.close()
        self.log.close()


async def as_client(url: str, token: str | None, steps, name: str = "agent-drops"):
    """Each (tool, arguments) called in turn by a client that names itself `name`; the results."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), client_info=Implementation(name=name, version="1"),
                          mode="legacy") as client:
            return [await client.call_tool(tool, args) for tool, args in steps]


def test_an_mcp_agent_proposes_and_a_person_approves_on_the_dashboard(stack):
    emit_reader_run(stack)
    mcp = McpProcess(stack, "--agent", "scout")
    try:
        secret = stack.root / "nats" / "server.conf"
        runs, page, write, nats, proposed = asyncio.run(as_client(mcp.url, MCP_TOKEN, [
            ("list_runs", {"filters": {"tags": "mcp"}}),
            ("history", {"run": "reader", "keys": ["train/loss"], "limit": 100}),
            ("sql", {"query": "drop view runs"}),
            ("sql", {"query": f"select * from read_text('{secret}')"}),
            ("propose_decision", {"run": RUN, "action": "checkpoint_now", "rationale": "loss flattened", "params": {},
                                  "agent": "agent-drops"}),  # (a name claimed in the arguments too: ignored)
        ]))
        assert [r["run_id"] for r in runs.structured_content["result"]] == [RUN]
        page = json.loads(page.content[0].text)
        assert page["columns"]["train/loss"] == [10.0 / (k + 1) for k in range(100)] and page["cursor"]
        assert write.is_error and "only queries are allowed" in write.content[0].text
        assert nats.is_error and "password" not in nats.content[0].text
        assert not proposed.is_error, proposed.content[0].text
        decision_id = json.loads(proposed.content[0].text)["decision_id"]
        assert decision_id.startswith(f"agent-scout:{RUN}:")
        # the client named itself agent-drops, in its handshake and its arguments: the proposal is the server's agent's
        assert wait_for_count(stack.root, f"select count(*) from decisions where decision_id = '{decision_id}'", 1) == 1
        from runledger import queries

        con = queries.connect(stack.root)
        row = con.execute("select producer, agent, mode from decisions where decision_id = ?", [decision_id]).fetchall()
        con.close()
        assert row == [("agent-scout", "agent-scout", "proposed")]

        for token in (None, "x" * 32):  # no token, a wrong one: refused before any tool runs
            refused = httpx2.post(mcp.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                  headers={"authorization": f"Bearer {token}"} if token else {})
            assert refused.status_code == 401 and "a valid token is required" in refused.text
        with pytest.raises(Exception):
            asyncio.run(as_client(mcp.url, "x" * 32, [("list_runs", {})]))
    finally:
        mcp.stop()

    tokens = stack.tmp / "ui-tokens.json"
    tokens.write_text(json.dumps({"token": WRITE_TOKEN, "read_token": READ_TOKEN}))
    ui = stack.start_ui("--token-file", str(tokens))
    feed = DecisionFeed(RUN, stack.nats.url, applied=set())
    try:
        assert feed.connected.wait(30)
        time.sleep(1.0)
        assert decision_id not in [d["decision_id"] for d in feed.ready()]  # proposed: not for the worker yet
        approved = httpx2.post(f"{ui.base}/api/decide", headers={"x-runledger-token": WRITE_TOKEN},
                               json={"run": RUN, "decision_id": decision_id, "action": "approve", "by": "alice"})
        assert approved.status_code in (200, 202), approved.text
        deadline = time.monotonic() + 60
        while decision_id not in [d["decision_id"] for d in feed.ready()] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [d for d in feed.ready() if d["decision_id"] == decision_id] == [
            {"decision_id": decision_id, "action": "checkpoint_now", "params": {}}]  # what the worker carries out

        api = runledger.Api(url=ui.base, token=READ_TOKEN)
        table = api.run("reader").history(["train/loss"])
        assert table.column("train/loss").to_pylist() == [10.0 / (k + 1) for k in range(STEPS)]
        assert api.runs({"project": "read"})[0].config == {"lr": 0.01}
        with pytest.raises(runledger.ApiError, match="refused: 401 .*token"):
            runledger.Api(url=ui.base).runs()
    finally:
        feed.close()

    out = stack.tmp / "export"
    done = run_cli("export", "--all", "--root", str(stack.root), "--out", str(out))
    assert done.returncode == 0, done.stderr
    checked = run_cli("verify", "--root", str(out))
    assert checked.returncode == 0 and "ok: every hash, chain and typed column checks out" in checked.stdout, checked.stdout


def test_runledger_mcp_over_stdio_as_a_client_starts_it(root):
    import os

    from mcp.client.stdio import StdioServerParameters

    from support.runs import build_run

    build_run(root)

    async def go():
        params = StdioServerParameters(command=sys.executable, args=["-m", "runledger.tools.cli", "mcp", "--root", str(root)],
                                       env={k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "PATH", "HOME")},
                                       cwd=str(REPO))
        async with Client(params) as client:
            return (await client.call_tool("list_runs", {}),
                    await client.call_tool("sql", {"query": "select count(*) from decisions"}))

    runs, count = asyncio.run(go())
    assert [r["run_id"] for r in runs.structured_content["result"]] == ["run-1"]
    assert json.loads(count.content[0].text)["rows"] == [[2]]
