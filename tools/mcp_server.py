"""`runledger mcp [--root DIR] [--agent NAME] [--http [--host H --port P --token-file F]]`: the ledger for LLM agents
over MCP (the `mcp` package, the [mcp] extra), on stdio by default or over streamable HTTP.

Read-only tools: `list_runs`, `history` (every point, in bounded pages with a cursor: runledger.queries.history),
`sql` (the dashboard console's own guard and bounds: runledger.ui.console), `health` (the health audit),
`decisions` (each decision of a run and what became of it, from replay) and `evidence` (an alert's evidence).
One that writes: `propose_decision`, which records a `decision` in mode `proposed` exactly as the agents'
proposals are recorded (a typed DecisionMade through the Emitter, spool first, on the agent's own chain), for
a person to approve on the dashboard or with `runledger decide`. It never approves or rejects, and the
proposer is the server's configured agent (`--agent NAME`: producer `agent-NAME`), never what the client says
of itself (an MCP client names itself in its handshake, and could name anyone).

Access as the dashboard's: stdio is the caller's own process; HTTP binds to loopback by default and every
request carries the token (`Authorization: Bearer T`): made up and printed with the address when not given
(`--token-file`), required for any other address, compared in constant time; a missing or wrong one is a 401.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import re
import secrets
from pathlib import Path
from typing import Any, Callable

from runledger.tools import checks
from runledger.tools.args import UsageError, add_nats, add_root

log = logging.getLogger(__name__)
DEFAULT_AGENT = "mcp"
MAX_PAGE = 10_000  # rows of one history page an MCP client gets (runledger.queries.history.MAX_PAGE bounds the dashboard's)
MAX_QUERY = 10_000  # characters of an sql query (the dashboard console's bound)
MAX_TEXT = 2_000  # characters of a rationale or a rule
_AGENT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,57}$")  # agent-NAME is a producer name (at most 64)


class Refused(ValueError):
    """A tool call refused; the message is the one-line reason the client reads."""


def producer_of(agent: str) -> str:
    """The producer name of the configured agent: `agent-NAME` (an agent's name: runledger.ledger.contract.roles)."""
    name = agent.removeprefix("agent-")
    if not _AGENT.fullmatch(name):
        raise ValueError(f"--agent {agent[:80]!r} is not a name of lowercase letters, digits, - and _ (at most 58)")
    return f"agent-{name}"


class Reads:
    """What the tools do, over one root, as the configured agent (`producer`), proposals sent to `nats` (a URL, or a
    function naming the root's server at each call, None while none runs)."""

    def __init__(self, root: str | Path, producer: str, nats: str | Callable[[], str | None] | None = None):
        self.root, self.producer, self.nats = Path(root), producer, nats

    def list_runs(self, filters: dict | None = None) -> list[dict]:
        from runledger.queries import history

        return _refusing(lambda: history.runs(self.root, filters or {}))

    def history(self, run: str, keys: list[str] | None = None, attempt: int | None = None, first_step: int | None = None,
                last_step: int | None = None, cursor: str | None = None, limit: int = 1000) -> dict:
        from runledger.queries import history

        run = self._run(run)
        if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise Refused(f"limit is a number of rows from 1 to {MAX_PAGE}")
        table, after = _refusing(lambda: history.history(self.root, run, keys, attempt=attempt, steps=(first_step, last_step),
                                                         after=cursor, limit=limit))
        return {"run": run, "rows": table.num_rows, "cursor": after,
                "columns": {c: history.jsonable_column(table.column(c)) for c in table.column_names}}

    def sql(self, query: str) -> dict:
        from runledger.ui import console

        if not isinstance(query, str) or len(query) > MAX_QUERY:
            raise Refused(f"the query is text of at most {MAX_QUERY} characters")
        return _refusing(lambda: console.sql(self.root, query))

    def health(self, run: str) -> dict:
        from runledger.queries.audit import run_suite

        run = self._run(run)
        audit = _refusing(lambda: run_suite(self.root, "health", run))
        return {"run": run, "failed": audit.failed, "checks": json.loads(json.dumps(audit.rows(), default=str))}

    def decisions(self, run: str) -> dict:
        from runledger.ledger.check.replay import replay_run

        run = self._run(run)
        state = _refusing(lambda: replay_run(self.root, run))
        return {"run": run, "decisions": json.loads(json.dumps(state.decisions, default=str))}

    def evidence(self, alert: str, run: str | None = None) -> list[dict]:
        from runledger import queries

        if not isinstance(alert, str) or not alert or len(alert) > MAX_TEXT:
            raise Refused("alert is an alert's id")
        where = f"alert_id = {queries.sql_str(alert)}" + (f" and run_id = {queries.sql_str(self._run(run))}" if run else "")
        cols, rows = _refusing(lambda: queries.query(
            self.root, f"select run_id, producer, alert_id, rule, severity, state, message, evidence, step, time "
                       f"from alerts where {where} order by stream_seq, seq", max_rows=100))
        if not rows:
            raise Refused(f"no alert {alert[:100]!r}" + (f" in run {run!r}" if run else ""))
        return [{**dict(zip(cols, r)), "evidence": _json_or_text(dict(zip(cols, r))["evidence"])} for r in rows]

    def propose_decision(self, run: str, action: str, params: dict | None, rationale: str, rule: str = "mcp") -> dict:
        """Record a proposed decision (mode `proposed`) as this server's agent; see the module docstring."""
        from pydantic import ValidationError

        from runledger.ledger.contract.events import ACTIONS, DecisionMade
        from runledger.ledger.decisions import review

        run = self._run(run)
        if action in review_actions():
            raise Refused(f"{action!r} is a person's review: an agent proposes, a person approves on the dashboard")
        if action not in ACTIONS:
            raise Refused(f"unknown action {str(action)[:60]!r}: one of {', '.join(a for a in ACTIONS if a not in review_actions())}")
        for name, text in (("rationale", rationale), ("rule", rule)):
            if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT:
                raise Refused(f"{name} is text of 1 to {MAX_TEXT} characters")
        params = params or {}
        digest = hashlib.sha256(json.dumps([action, params, rationale], sort_keys=True).encode()).hexdigest()[:16]
        decision_id = f"{self.producer}:{run}:{rule}:{digest}"  # (as an agent's: its producer, the run, the rule, a key)
        try:
            decision = DecisionMade(decision_id=decision_id, agent=self.producer, rule=rule, action=action, params=params,
                                    rationale=rationale, evidence={"via": "mcp"}, mode="proposed")
        except ValidationError as err:
            raise Refused(f"params do not fit {action}: {_first_error(err)}") from None
        known = self.decisions(run)["decisions"]
        if decision_id in known:
            return {"decision_id": decision_id, "status": known[decision_id].get("status"), "note": "proposed already"}
        url = self.nats() if callable(self.nats) else self.nats
        if url is None:
            raise Refused("no NATS server to send the proposal to (start the root's, or give --nats)")
        acked = _refusing(lambda: review.record(self.root, url, run, decision, self.producer))
        return {"decision_id": decision_id, "status": "proposed", "agent": self.producer, "acknowledged": acked,
                "note": "a person approves or rejects it on the dashboard (or `runledger decide`)"}

    def _run(self, run: Any) -> str:
        """A run's id, from its id or its name (runledger.queries.names.resolve_run)."""
        from runledger.ledger.contract.events import NAME_RE
        from runledger.queries.names import resolve_run

        if not isinstance(run, str) or not run.strip() or len(run) > 1000:
            raise Refused("run is a run's id or name")
        from runledger.ledger.storage.paths import event_files

        run_id = _refusing(lambda: resolve_run(self.root, run))
        if not NAME_RE.fullmatch(run_id) or not _refusing(lambda: event_files(self.root, run_id=run_id)):
            raise Refused(f"no run has the id or name {run[:100]!r}")
        return run_id


def review_actions() -> tuple[str, ...]:
    from runledger.ledger.contract.decision_state import REVIEWS

    return tuple(REVIEWS)


def _json_or_text(v):
    try:
        return json.loads(v) if isinstance(v, str) else v
    except ValueError:
        return v


def _first_error(err) -> str:
    e = err.errors()[0]
    return f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"[:300]


def _refusing(read: Callable[[], Any]) -> Any:
    """`read()`, a refusal of the read (bad input, a guard, a bound, SQL that does not run) as Refused, one line."""
    import duckdb

    from runledger import queries
    from runledger.ledger.storage.paths import NotALedger, SnapshotGone

    try:
        return read()
    except Refused:
        raise
    except (ValueError, NotALedger, SnapshotGone, queries.QueryTimeout, LookupError) as err:
        raise Refused(" ".join(str(err).split())[:500] or type(err).__name__) from None
    except duckdb.Error as err:
        raise Refused(f"SQL error: {str(err).splitlines()[0][:500]}") from None


def build(reads: Reads):
    """The MCPServer whose tools are `reads`' methods (each refusal an error result with its one line)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer(name="runledger", instructions=(
        "The runledger ledger of ML training runs: read runs, every point of their histories, SQL over the ledger's "
        "views (read-only, bounded), health audits, decisions and alerts' evidence. propose_decision records a "
        "proposal a person must approve; nothing here approves."))

    def tool(fn):
        async def call(**kw):
            from starlette.concurrency import run_in_threadpool

            try:
                return await run_in_threadpool(lambda: fn(**kw))
            except Refused as err:
                raise ToolError(str(err)) from None
        return call

    @server.tool(description="The runs with config, tags, state and summary; filters e.g. {\"project\": \"p\", "
                             "\"tags\": \"t\", \"state\": \"running\", \"config.lr\": 0.001}.")
    async def list_runs(filters: dict | None = None) -> list[dict]:
        return await tool(reads.list_runs)(filters=filters)

    @server.tool(description="Every point of a run's metrics (no sampling), a page of at most `limit` rows: "
                             "columns step, attempt, time and one per key; pass back `cursor` for the next page.")
    async def history(run: str, keys: list[str] | None = None, attempt: int | None = None, first_step: int | None = None,
                      last_step: int | None = None, cursor: str | None = None, limit: int = 1000) -> dict:
        return await tool(reads.history)(run=run, keys=keys, attempt=attempt, first_step=first_step,
                                         last_step=last_step, cursor=cursor, limit=limit)

    @server.tool(description="A read-only SQL query over the ledger's views (events, runs, metrics, steps, alerts, "
                             "decisions, ...), bounded in time, rows and bytes, as the dashboard's console.")
    async def sql(query: str) -> dict:
        return await tool(reads.sql)(query=query)

    @server.tool(description="The health audit of a run: each check, its status and evidence.")
    async def health(run: str) -> dict:
        return await tool(reads.health)(run=run)

    @server.tool(description="A run's decisions and what became of each (proposed, approved, rejected, applied, ...).")
    async def decisions(run: str) -> dict:
        return await tool(reads.decisions)(run=run)

    @server.tool(description="The evidence an alert was raised on (its query's rows), by the alert's id.")
    async def evidence(alert: str, run: str | None = None) -> list[dict]:
        return await tool(reads.evidence)(alert=alert, run=run)

    @server.tool(description="Propose a decision for a run (mode proposed): a person approves or rejects it on the "
                             "dashboard. Actions: set_token_horizon, set_capacity_factor, set_dispatch, "
                             "hold_context_extension, release_context_extension, set_z_loss_weight, checkpoint_now, rollback.")
    async def propose_decision(run: str, action: str, rationale: str, params: dict | None = None, rule: str = "mcp") -> dict:
        return await tool(reads.propose_decision)(run=run, action=action, params=params, rationale=rationale, rule=rule)

    return server


class TokenGate:
    """ASGI: every HTTP request carries `Authorization: Bearer TOKEN` (else 401), and, bound to loopback, names a
    loopback Host (a DNS-rebinding page reads nothing)."""

    def __init__(self, app, token: str, loopback: bool):
        self.app, self.token, self.loopback = app, token.encode(), loopback

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            from runledger.ui.access import is_loopback

            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            auth = headers.get("authorization", "")
            given = auth[7:].strip().encode() if auth.lower().startswith("bearer ") else b""
            if self.loopback and not is_loopback(headers.get("host", "").rsplit(":", 1)[0]):
                return await _refuse(send, 403, "this MCP server answers only to a loopback Host")
            if not given or not hmac.compare_digest(given, self.token):
                return await _refuse(send, 401, "a valid token is required: Authorization: Bearer TOKEN "
                                                "(the one `runledger mcp --http` printed, or its --token-file's)")
        return await self.app(scope, receive, send)


async def _refuse(send, status: int, reason: str) -> None:
    body = reason.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def http_app(server, token: str, host: str):
    """The streamable-HTTP app (path /mcp) behind the token."""
    from runledger.ui.access import is_loopback

    return TokenGate(server.streamable_http_app(host=host), token, is_loopback(host))


def read_token(path: str) -> str:
    """The token of a token file: JSON {"token": T} (the dashboard's format), or the file's one line."""
    text = Path(path).read_text().strip()
    try:
        doc = json.loads(text)
        token = doc.get("token") if isinstance(doc, dict) else None
    except ValueError:
        token = text
    if not isinstance(token, str) or len(token) < 16:
        raise UsageError(f"{path}: a token of at least 16 characters (JSON {{\"token\": ...}} or one line)")
    return token


def cmd_mcp(args: argparse.Namespace) -> int:
    from runledger.tools.args import server_of

    try:
        producer = producer_of(args.agent)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        nats = server_of(args)
    except (OSError, UsageError) as err:
        raise UsageError(f"cannot name the NATS server: {err}") from None
    reads = Reads(args.root, producer, nats)
    server = build(reads)
    if not args.http:
        server.run("stdio")
        return 0
    from runledger.tools.ui import listen, serve_http
    from runledger.ui.access import is_loopback

    token = read_token(args.token_file) if args.token_file else None
    if token is None and not is_loopback(args.host):
        raise UsageError(f"--host {args.host} is not loopback: give --token-file (every request must carry its token)")
    made = token is None
    token = token or secrets.token_urlsafe(24)
    sock, port = listen(args.host, args.port)
    def when_up(url: str) -> None:
        print(f"{url}mcp" + (f" token={token}" if made else ""), flush=True)
        log.info("runledger mcp over %s as %s (HTTP; token %s)", args.root, producer,
                 "made up: printed above" if made else f"of {args.token_file}")

    serve_http(http_app(server, token, args.host), args.host, sock, port, when_up)
    return 0


def register(sub) -> None:
    s = sub.add_parser("mcp", help="read-only MCP tools and propose_decision for agents (stdio, or --http)")
    add_root(s)
    add_nats(s)
    s.add_argument("--agent", default=DEFAULT_AGENT, metavar="NAME",
                   help=f"the agent its proposals are recorded as (producer agent-NAME; default {DEFAULT_AGENT}): "
                        "the server's, never what a client says")
    s.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp (default: stdio)")
    s.add_argument("--host", type=checks.line, default="127.0.0.1", help="with --http: the address (default loopback; "
                                                                        "any other needs --token-file)")
    s.add_argument("--port", type=checks.int_in(0, 65535, "a TCP port"), default=0, help="with --http: the port (0: a free one)")
    s.add_argument("--token-file", type=checks.file_in, default=None,
                   help='with --http: JSON {"token": T} or a line: the token every request carries (default: made up, printed)')
    s.set_defaults(func=cmd_mcp)
