"""The dashboard's ASGI app (`runledger ui`): the page and its JSON API over `runledger.ui.data.Reader`, the live
event stream (server-sent events fed by `runledger.ui.live.Feed`), and the review buttons, behind `runledger.ui.access`.

Routes: `/` the page (runs, run, compare, ladder and SQL views, routed in the browser); `/static/*` its
script, style and the vendored uPlot; `/api/*` JSON (`/api/health?runs=A,B`: the health counts of the
runs the list shows, in one pass; `/api/runs?metrics=M,N`: the rows with each run's last value of those
metrics, default the first section the runs share; `/api/compare?runs=A,B[&source=S&keys=K,L]`: the runs'
points of K, L (default the first section they share), every metric they logged and the config keys that
differ; `/api/run/R/config`: its config with every config.update applied, and the step each key changed
at; `/api/run/R/values`: its histograms' heat maps, tables and newest images; `/api/run/R/table?key=K[&step=S&q=Q]`:
a logged table's rows at a step, searched; `/api/run/R/media/SHA256`: a blob the run's media events name;
`/api/run/R/console?q=Q`: its last console lines, or those holding Q);
`/api/history?run=R&keys=K,L[&attempt=&from=&to=&limit=&cursor=]` every point of the run, a bounded page
at a time with the cursor of the next (`runledger.queries.history`, what `runledger.Api(url=)` reads), and
`/api/history/runs?filters={...}` the runs with config, tags and summary; `/api/live?run=R&since=SEQ` the event
stream (runledger.ui.streams: capped, one read per wake per run); `/api/tlog/proof/EVENT_ID` an event's C2SP tlog-proof; `/tlog/checkpoint` and `/tlog/tile/...` the
transparency log, public (runledger.ui.tlog); `POST /api/decide` approve or reject a proposed
decision; `POST /api/ack` acknowledge an alert (an `alert_ack` event from producer `ui`: notify stops repeating its page).

Every route checks its input before anything is read: a bad run id, number, source, key or body is a
400 (a body too big 413, not JSON 415) with a one-line reason, never a 500.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Callable

import duckdb
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from runledger import queries
from runledger.ledger.decisions import acknowledge, review
from runledger.queries import history
from runledger.ledger.contract.validation import check_name
from runledger.ui.access import MAX_BODY, Access, AccessMiddleware
from runledger.ui.compare import compared_metrics, config_diff, default_metrics, logged, opened_on, overlaid
from runledger.ui.data import Reader
from runledger.ui.live import Feed
from runledger.ui.streams import Full, Streams
from runledger.ui.tlog import proof_route, tlog_route

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0  # an SSE comment this often keeps proxies from closing a quiet stream
MAX_COMPARE = 20  # runs overlaid on the compare view
MAX_HEALTH = 200  # runs whose health counts one request asks for (the runs page asks for the rows it shows)
DECIDE_TIMEOUT_S = 30.0  # how long a review waits for NATS to acknowledge it (else it stays spooled)
MAX_KEYS = 256  # chart keys one series request asks for (a page asks for a source's keys at once)
MAX_TEXT = 1000  # characters of a filter, a ladder's name, a decision id or a reason
MAX_QUERY = 10_000  # characters of a console query (a GET: uvicorn takes about 16 KB of request line)
MAX_X = 1e15  # |x| of a zoomed range: steps, or seconds since the epoch, are far below it
MAX_COLUMNS = 16  # metric columns of the runs page (each the last value of one metric)
MAX_NAME = 300  # characters of one metric's name in a request (the logging API takes names of up to 200)
DEFAULT_COLUMNS = 3  # metric columns the runs page opens with (the first section the runs share)
MAX_CHARTS = 16  # metrics one compare request draws
DEFAULT_CHARTS = 6  # metrics compare opens on (the first section the runs share)
MAX_NAMES = 5000  # metric names the runs page and compare list for their pickers


def _json(data, status: int = 200) -> Response:
    import orjson

    return Response(orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS), status_code=status,
                    media_type="application/json")


def _error(status: int, reason: str) -> Response:
    return _json({"error": reason}, status)


class BadInput(ValueError):
    """A request's input the route refuses (a 400 with this one-line reason)."""


def _float(v: str | None, name: str) -> float | None:
    """A finite number of at most MAX_X, or None when not given."""
    if v in (None, ""):
        return None
    try:
        x = float(v)
    except ValueError:
        raise BadInput(f"{name} must be a number, not {v[:40]!r}") from None
    if not abs(x) <= MAX_X:
        raise BadInput(f"{name} must be a finite number of at most {MAX_X:g} in size")
    return x


def _int(v: str | None, name: str, default: int, lo: int = 0, hi: int = 2**62) -> int:
    """A whole number in [lo, hi], or `default` when not given."""
    if v in (None, ""):
        return default
    if not (v.isascii() and v.isdigit()) or not lo <= int(v) <= hi:
        raise BadInput(f"{name} must be a whole number from {lo} to {hi}, not {v[:40]!r}")
    return int(v)


def _text(v: str, name: str, limit: int = MAX_TEXT) -> str:
    if len(v) > limit:
        raise BadInput(f"{name} is longer than {limit} characters")
    return v


def _names(v: str | None, name: str, most: int) -> list[str]:
    """A comma-separated list of at most `most` metric names, each of at most MAX_NAME characters."""
    names = [n for n in (v or "").split(",") if n]
    if len(names) > most:
        raise BadInput(f"{name}: at most {most} metric names at a time")
    for n in names:
        if len(n) > MAX_NAME:
            raise BadInput(f"{name}: a metric name of at most {MAX_NAME} characters")
    return list(dict.fromkeys(names))


def _keys(v: str | None) -> list[str] | None:
    """The keys of a history read: a JSON list of names, or names separated by commas; none given: every key."""
    if not v:
        return None
    if v.startswith("["):
        try:
            keys = json.loads(v)
        except ValueError:
            raise BadInput("keys: a JSON list of metric names, or names separated by commas") from None
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise BadInput("keys: a JSON list of metric names")
    else:
        keys = [k for k in v.split(",") if k]
    if len(keys) > history.MAX_KEYS:
        raise BadInput(f"keys: at most {history.MAX_KEYS} at a time")
    for k in keys:
        if not k or len(k) > MAX_NAME:
            raise BadInput(f"keys: a metric name of 1 to {MAX_NAME} characters")
    return keys


class HTTPError(Exception):
    """A refusal with its own status (413, 415, 429)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


async def _body(request: Request) -> dict:
    """The request's JSON object, read up to MAX_BODY bytes (BadInput, or 413/415 as HTTPError)."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise HTTPError(415, "the body must be JSON (Content-Type: application/json)")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise HTTPError(413, f"a body of at most {MAX_BODY} bytes")
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise BadInput(f"the body is not JSON: {str(err).splitlines()[0]}") from None
    if not isinstance(body, dict):
        raise BadInput(f"the body must be a JSON object, not {type(body).__name__}")
    return body


async def _run_id(request: Request, reader: Reader) -> str:
    """The run a route is about: its id, or its name where one run has it (`Reader.run_id`)."""
    run = request.path_params.get("run") or request.query_params.get("run", "")
    if not run.strip() or len(run) > 1000:
        raise BadInput("a run id or name, up to 1000 characters")
    run = await run_in_threadpool(reader.run_id, run)
    check_name(run, "run_id")
    return run


class LiveResponse(StreamingResponse):
    """An event stream that gives its place back however it ends (even before its first byte)."""

    def __init__(self, sub, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sub = sub

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.sub.close()


def create_app(root: str | Path, nats_url: str | Callable[[], str | None] | None, access: Access | None = None,
               threads: int | None = None, decide_url: str | None = None) -> Starlette:
    """The app over the ledger at `root`; `nats_url` feeds the live updates (a URL; a function naming the
    root's server at each call, None while none runs; or None: the tables are polled, see ui/live.py) and
    carries the reviews (`decide_url`, default the same)."""
    reader = Reader(root, threads=threads)
    feed = Feed(reader, nats_url)
    streams = Streams(reader, feed)
    access = access or Access()
    decide_url = decide_url or nats_url

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    async def favicon(request: Request) -> Response:  # (asked by every browser on every load)
        return FileResponse(STATIC / "favicon.ico", media_type="image/x-icon", headers={"cache-control": "max-age=86400"})

    async def api_status(request: Request) -> Response:
        role = request.scope.get("state", {}).get("role")
        return _json({**feed.status(), "root": str(reader.root), "role": role, "can_decide": role == "write"})

    async def api_runs(request: Request) -> Response:
        q = request.query_params
        filters = [_text(q.get(k, ""), k) for k in ("name", "tag", "status", "config")]
        chosen = _names(q.get("metrics"), "metrics", MAX_COLUMNS) if "metrics" in q else None

        def gather():
            files = reader.run_files()  # (listed once for the rows and their metrics' last values)
            counts = reader.metric_counts(files)
            columns = default_metrics(counts, DEFAULT_COLUMNS) if chosen is None else chosen
            names = [{"name": n, "runs": c} for n, c in list(counts.items())[:MAX_NAMES]]
            return {"runs": reader.runs(*filters, metrics=columns, files=files), "columns": columns, "metrics": names,
                    "position": reader.position}

        try:
            return _json(await run_in_threadpool(gather))
        except ValueError as err:
            return _error(400, str(err))

    async def api_run_config(request: Request) -> Response:
        run = await _run_id(request, reader)
        return _json(await run_in_threadpool(reader.run_config, run))

    async def api_run(request: Request) -> Response:
        run = await _run_id(request, reader)

        return _json(await run_in_threadpool(reader.run_info, run))

    async def api_values(request: Request) -> Response:
        run = await _run_id(request, reader)
        return _json(await run_in_threadpool(reader.values, run))

    async def api_table(request: Request) -> Response:
        run, q = await _run_id(request, reader), request.query_params
        key = _text(q.get("key", ""), "key", MAX_NAME)
        step = _int(q.get("step"), "step", -1) if q.get("step") else None
        return _json(await run_in_threadpool(reader.logged_table, run, key, step, _text(q.get("q", ""), "q")))

    async def api_console(request: Request) -> Response:
        run = await _run_id(request, reader)
        return _json(await run_in_threadpool(reader.console, run, _text(request.query_params.get("q", ""), "q")))

    async def api_media(request: Request) -> Response:
        run, digest = await _run_id(request, reader), request.path_params["sha256"]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise BadInput("a blob is named by its SHA-256: 64 lowercase hex digits")
        try:
            data, kind = await run_in_threadpool(reader.blob, run, digest)
        except LookupError as err:
            return _error(404, str(err))
        return Response(data, media_type=kind, headers={"cache-control": "private, max-age=86400",
                                                        "content-security-policy": "default-src 'none'",
                                                        **({} if kind.startswith("image/") else
                                                           {"content-disposition": f'attachment; filename="{digest}"'})})

    async def api_series(request: Request) -> Response:
        run, q = await _run_id(request, reader), request.query_params
        source = q.get("source", "step")
        keys = [k for k in q.get("keys", "").split(",") if k] if q.get("keys") else []
        if len(keys) > MAX_KEYS:
            raise BadInput(f"at most {MAX_KEYS} keys at a time")
        px, x0, x1 = _int(q.get("px"), "px", 600, 1, 100_000), _float(q.get("x0"), "x0"), _float(q.get("x1"), "x1")
        xaxis = _text(q.get("x") or "step", "x", 300)  # step, tokens, time, rel or metric:NAME (runledger.ui.series.x_axis)
        try:
            if source == "drops":
                out = await run_in_threadpool(reader.layer_drops, run, px, x0, x1, xaxis)
            else:
                out = await run_in_threadpool(reader.series, run, source, keys, px, x0, x1, xaxis)
        except (KeyError, ValueError) as err:
            return _error(400, str(err))
        return _json(out)

    async def api_audit(request: Request) -> Response:
        run, suite = await _run_id(request, reader), request.path_params["suite"]
        if suite not in ("health", "provenance", "forecast", "fork"):
            return _error(404, f"no suite {suite!r}")
        try:
            # (stale: the answer of the files read last time, while the new files' audit runs: runledger.ui.audits)
            return _json({"suite": suite, **await run_in_threadpool(reader.audit_answer, run, suite)})
        except (duckdb.Error, ValueError) as err:
            return _error(500, f"the {suite} audit failed: {str(err).splitlines()[0]}")

    async def api_health(request: Request) -> Response:
        runs = [r for r in request.query_params.get("runs", "").split(",") if r][:MAX_HEALTH]
        for r in runs:
            check_name(r, "run_id")
        try:
            return _json({"health": await run_in_threadpool(reader.health, runs)})
        except duckdb.Error as err:
            return _error(500, f"the health checks failed: {str(err).splitlines()[0]}")

    async def api_compare(request: Request) -> Response:
        q = request.query_params
        runs = [r for r in q.get("runs", "").split(",") if r][:MAX_COMPARE]
        for r in runs:
            check_name(r, "run_id")
        source, px = q.get("source", "step"), _int(q.get("px"), "px", 800, 1, 100_000)
        if source not in ("step", "metrics", "eval", "system"):
            raise BadInput(f"unknown source {source[:40]!r}")
        asked = _names(q.get("keys") or q.get("key"), "keys", MAX_CHARTS) if (q.get("keys") or q.get("key")) else None

        def gather():
            with reader.scoped(runs) as cur:  # (one cursor over the runs' files: one pass per source)
                keys = logged(cur, runs)
                metrics = compared_metrics(keys)
                src, shown = (source, asked) if asked is not None else opened_on(metrics, DEFAULT_CHARTS)
                drawn = [k for k in shown if any(k in keys[r].get(src, []) for r in runs)]
                series = overlaid(cur, runs, src, drawn, px) if drawn else {}
            series = {k: series.get(k, {r: {} for r in runs}) for k in shown}
            rows = reader.summaries()
            labels = {r: {f: rows[r].get(f) for f in ("name", "group", "job_type")} if r in rows else {} for r in runs}
            return {"runs": runs, "labels": labels, "metrics": metrics[:MAX_NAMES], "source": src, "keys": shown,
                    "series": series, "diff": config_diff(reader.configs(runs))}

        return _json(await run_in_threadpool(gather))

    async def api_ladders(request: Request) -> Response:
        return _json({"ladders": await run_in_threadpool(reader.ladders)})

    async def api_ladder(request: Request) -> Response:
        name = _text(request.path_params["name"], "a ladder's name", 200)

        def gather():
            return {"ladder": name, "rungs": reader.rungs(name), "targets": reader.ladder_forecasts(name)}

        return _json(await run_in_threadpool(gather))

    async def api_sql(request: Request) -> Response:
        text = _text(request.query_params.get("q", ""), "the query", MAX_QUERY)
        try:
            return _json(await run_in_threadpool(reader.sql, text))
        except (queries.ReadOnlyViolation, queries.QueryTimeout) as err:
            return _error(400, str(err))
        except duckdb.Error as err:
            return _error(400, f"SQL error: {str(err).splitlines()[0]}")

    async def api_history(request: Request) -> Response:
        """Every point of a run, a bounded page at a time: runledger.queries.history (run, keys as a JSON list
        or comma-separated, attempt, from, to, source, limit, cursor)."""
        run, q = await _run_id(request, reader), request.query_params
        keys = _keys(q.get("keys"))
        attempt = _int(q.get("attempt"), "attempt", None) if q.get("attempt") else None
        lo = _int(q.get("from"), "from", None) if q.get("from") else None
        hi = _int(q.get("to"), "to", None) if q.get("to") else None
        limit = _int(q.get("limit"), "limit", history.DEFAULT_PAGE, 1, history.MAX_PAGE)
        cursor = _text(q.get("cursor") or "", "cursor", 2000) or None
        try:
            table, after = await run_in_threadpool(history.history, reader.root, run, keys, attempt=attempt, steps=(lo, hi),
                                                   source=q.get("source", "metrics"), after=cursor, limit=limit)
        except history.BadCursor as err:
            return _error(400, str(err))
        except ValueError as err:  # (UnknownKey, a bad source)
            return _error(400, str(err).splitlines()[0])
        except duckdb.Error as err:
            return _error(500, f"the history read failed: {str(err).splitlines()[0]}")
        return _json({"run": run, "column_order": table.column_names, "rows": table.num_rows, "cursor": after,
                      "columns": {c: history.jsonable_column(table.column(c)) for c in table.column_names}})

    async def api_history_runs(request: Request) -> Response:
        """The runs with their config, tags and summary (runledger.queries.history.runs; `filters`: a JSON object)."""
        text = _text(request.query_params.get("filters") or "{}", "filters", MAX_TEXT)
        try:
            filters = json.loads(text)
        except ValueError:
            raise BadInput("filters must be a JSON object") from None
        if not isinstance(filters, dict):
            raise BadInput("filters must be a JSON object")
        return _json({"runs": await run_in_threadpool(history.runs, reader.root, filters)})

    async def api_decide(request: Request) -> Response:
        body = await _body(request)
        for k in ("run", "decision_id", "action", "by"):
            if not isinstance(body.get(k), str) or not body[k]:
                raise BadInput(f"{k!r} must be a non-empty string")
        if not isinstance(body.get("reason"), (str, type(None))):
            raise BadInput("'reason' must be a string or null")
        run, target, action, by = check_name(body["run"], "run_id"), body["decision_id"], body["action"], body["by"].strip()
        _text(target, "decision_id")
        _text(body.get("reason") or "", "reason")
        if action not in ("approve", "reject"):
            raise BadInput("'action' must be approve or reject")
        try:
            decision = review.review(target, action == "approve", by, body.get("reason") or None)
            if decide_url is None:
                return _error(503, "no NATS server to send the decision to")
            url = decide_url() if callable(decide_url) else decide_url  # (the root's now; none: spooled, sent once one runs)
            acked = await run_in_threadpool(review.record, reader.root, url, run, decision, "ui", True,
                                            DECIDE_TIMEOUT_S)
        except review.ReviewRefused as err:
            return _error(409, str(err))
        except (ValueError, TypeError) as err:
            return _error(400, str(err).splitlines()[0])
        return _json({"decision_id": decision.decision_id, "acknowledged": acked,
                      "note": None if acked else "spooled: NATS has not acknowledged it yet; it will be sent"},
                     200 if acked else 202)

    async def api_ack(request: Request) -> Response:
        body = await _body(request)
        for k in ("run", "alert_id", "by"):
            if not isinstance(body.get(k), str) or not body[k]:
                raise BadInput(f"{k!r} must be a non-empty string")
        run = check_name(body["run"], "run_id")
        try:
            ack = acknowledge.acknowledgement(body["alert_id"], body["by"].strip(), "dashboard", body.get("note"))
            def known() -> int:
                with reader.scoped([run]) as cur:
                    return cur.execute("select count(*) from alerts where run_id = $run and alert_id = $id",
                                       {"run": run, "id": body["alert_id"]}).fetchone()[0]

            if not await run_in_threadpool(known):
                return _error(404, f"no alert {body['alert_id'][:100]!r} in run {run!r}")
            if decide_url is None:
                return _error(503, "no NATS server to send the acknowledgement to")
            url = decide_url() if callable(decide_url) else decide_url
            acked = await run_in_threadpool(acknowledge.record, reader.root, url, run, ack, "ui", DECIDE_TIMEOUT_S)
        except (ValueError, TypeError) as err:
            return _error(400, str(err).splitlines()[0])
        return _json({"alert_id": body["alert_id"], "acknowledged": acked,
                      "note": None if acked else "spooled: NATS has not acknowledged it yet; it will be sent"},
                     200 if acked else 202)

    async def api_live(request: Request) -> Response:
        run = request.query_params.get("run") or None
        if run is not None:
            check_name(run, "run_id")
        since = _int(request.query_params.get("since"), "since", 0)
        try:
            sub = streams.open(run, since)
        except Full as err:
            return _error(429, str(err))

        async def stream():
            try:
                while True:
                    event = await sub.next(KEEPALIVE_S)
                    if event is not None:
                        yield f"event: {event['event']}\ndata: {_json(event['data']).body.decode()}\n\n"
                    elif sub.closed or await request.is_disconnected():
                        return
                    else:
                        yield ": keepalive\n\n"
            finally:
                sub.close()

        return LiveResponse(sub, stream(), media_type="text/event-stream",
                            headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    @asynccontextmanager
    async def lifespan(app):
        await feed.start()
        try:
            yield
        finally:
            await streams.stop()
            await feed.stop()
            reader.close()

    routes = [
        Route("/", index),
        Route("/favicon.ico", favicon),
        Route("/api/status", api_status),
        Route("/api/runs", api_runs),
        Route("/api/run/{run}", api_run),
        Route("/api/run/{run}/series", api_series),
        Route("/api/run/{run}/config", api_run_config),
        Route("/api/run/{run}/values", api_values),
        Route("/api/run/{run}/table", api_table),
        Route("/api/run/{run}/media/{sha256}", api_media),
        Route("/api/run/{run}/console", api_console),
        Route("/api/run/{run}/audit/{suite}", api_audit),
        Route("/api/health", api_health),
        Route("/api/compare", api_compare),
        Route("/api/ladders", api_ladders),
        Route("/api/ladder/{name}", api_ladder),
        Route("/api/sql", api_sql),
        Route("/api/history", api_history),
        Route("/api/history/runs", api_history_runs),
        Route("/api/decide", api_decide, methods=["POST"]),
        Route("/api/ack", api_ack, methods=["POST"]),
        Route("/api/live", api_live),
        Route("/api/tlog/proof/{event_id}", proof_route(root)),
        Route("/tlog/{path:path}", tlog_route(root), methods=["GET", "HEAD"]),  # public: runledger.ui.tlog
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    async def bad_input(request: Request, err: Exception) -> Response:  # a run id that is not a name, say
        return _error(400, (str(err).splitlines() or ["bad input"])[0])

    async def refused(request: Request, err: HTTPError) -> Response:
        return _error(err.status, str(err))

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={ValueError: bad_input, HTTPError: refused})
    app.state.reader, app.state.feed, app.state.streams, app.state.access = reader, feed, streams, access
    return AccessMiddleware(app, access)

