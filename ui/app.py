"""The dashboard's ASGI app (`runledger ui`): the page and its JSON API over `ui.data.Reader`, the live
event stream (server-sent events fed by `ui.live.Feed`), and the review buttons, behind `ui.access`.

Routes: `/` the page (runs, run, compare, ladder and SQL views, routed in the browser); `/static/*` its
script, style and the vendored uPlot; `/api/*` JSON (`/api/health?runs=A,B`: the health counts of the
runs the list shows, in one pass); `/api/live?run=R&since=SEQ` the event stream;
`POST /api/decide` approve or reject a proposed decision.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path

import duckdb
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import queries
from ledger import review
from ledger.validation import check_name
from ui.access import Access, AccessMiddleware
from ui.data import Reader, config_diff
from ui.live import Feed

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0  # an SSE comment this often keeps proxies from closing a quiet stream
MAX_COMPARE = 20  # runs overlaid on the compare view
MAX_HEALTH = 200  # runs whose health counts one request asks for (the runs page asks for the rows it shows)
DECIDE_TIMEOUT_S = 30.0  # how long a review waits for NATS to acknowledge it (else it stays spooled)


def _json(data, status: int = 200) -> Response:
    import orjson

    return Response(orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS), status_code=status,
                    media_type="application/json")


def _error(status: int, reason: str) -> Response:
    return _json({"error": reason}, status)


def _float(v: str | None) -> float | None:
    return None if v in (None, "") else float(v)


def _run_id(request: Request) -> str:
    run = request.path_params.get("run") or request.query_params.get("run", "")
    check_name(run, "run_id")
    return run


def create_app(root: str | Path, nats_url: str | None, access: Access | None = None,
               threads: int | None = None, decide_url: str | None = None) -> Starlette:
    """The app over the ledger at `root`; `nats_url` feeds the live updates (None: no live push) and
    carries the reviews (`decide_url`, default the same)."""
    reader = Reader(root, threads=threads)
    feed = Feed(reader, nats_url)
    access = access or Access()
    decide_url = decide_url or nats_url

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    async def api_status(request: Request) -> Response:
        role = request.scope.get("state", {}).get("role")
        return _json({**feed.status(), "root": str(reader.root), "role": role, "can_decide": role == "write"})

    async def api_runs(request: Request) -> Response:
        q = request.query_params
        try:
            rows = await run_in_threadpool(reader.runs, q.get("name", ""), q.get("tag", ""), q.get("status", ""),
                                           q.get("config", ""))
        except ValueError as err:
            return _error(400, str(err))
        return _json({"runs": rows, "position": reader.position})

    async def api_run(request: Request) -> Response:
        run = _run_id(request)

        return _json(await run_in_threadpool(reader.run_info, run))

    async def api_series(request: Request) -> Response:
        run, q = _run_id(request), request.query_params
        source = q.get("source", "step")
        keys = [k for k in q.get("keys", "").split(",") if k] if q.get("keys") else []
        px, x0, x1 = int(q.get("px", 600)), _float(q.get("x0")), _float(q.get("x1"))
        try:
            if source == "drops":
                out = await run_in_threadpool(reader.layer_drops, run, px, x0, x1)
            else:
                out = await run_in_threadpool(reader.series, run, source, keys, px, x0, x1)
        except (KeyError, ValueError) as err:
            return _error(400, str(err))
        return _json(out)

    async def api_audit(request: Request) -> Response:
        run, suite = _run_id(request), request.path_params["suite"]
        if suite not in ("health", "provenance", "forecast"):
            return _error(404, f"no suite {suite!r}")
        try:
            return _json({"suite": suite, "results": await run_in_threadpool(reader.audit, run, suite)})
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
        source, key, px = q.get("source", "step"), q.get("key", "loss"), int(q.get("px", 800))

        def gather():
            series = {}
            for r in runs:
                try:
                    series[r] = reader.series(r, source, [key], px)["keys"][key]
                except KeyError:
                    series[r] = {}
            return {"runs": runs, "series": series, "diff": config_diff(reader.configs(runs))}

        return _json(await run_in_threadpool(gather))

    async def api_ladders(request: Request) -> Response:
        return _json({"ladders": await run_in_threadpool(reader.ladders)})

    async def api_ladder(request: Request) -> Response:
        name = request.path_params["name"]

        def gather():
            return {"ladder": name, "rungs": reader.rungs(name), "targets": reader.ladder_forecasts(name)}

        return _json(await run_in_threadpool(gather))

    async def api_sql(request: Request) -> Response:
        text = request.query_params.get("q", "")
        try:
            return _json(await run_in_threadpool(reader.sql, text))
        except (queries.ReadOnlyViolation, queries.QueryTimeout) as err:
            return _error(400, str(err))
        except duckdb.Error as err:
            return _error(400, f"SQL error: {str(err).splitlines()[0]}")

    async def api_decide(request: Request) -> Response:
        try:
            body = await request.json()
            run = body.get("run", "")
            check_name(run, "run_id")
            target, action, by = body.get("decision_id", ""), body.get("action"), str(body.get("by", "")).strip()
            if action not in ("approve", "reject") or not target:
                return _error(400, "action must be approve or reject, with a decision_id")
            decision = review.review(target, action == "approve", by, body.get("reason") or None)
            if decide_url is None:
                return _error(503, "no NATS server to send the decision to")
            acked = await run_in_threadpool(review.record, reader.root, decide_url, run, decision, "ui", True,
                                            DECIDE_TIMEOUT_S)
        except review.ReviewRefused as err:
            return _error(409, str(err))
        except (ValueError, TypeError) as err:
            return _error(400, str(err).splitlines()[0])
        return _json({"decision_id": decision.decision_id, "acknowledged": acked,
                      "note": None if acked else "spooled: NATS has not acknowledged it yet; it will be sent"},
                     200 if acked else 202)

    async def api_live(request: Request) -> Response:
        run = request.query_params.get("run") or None
        if run is not None:
            check_name(run, "run_id")
        since = int(request.query_params.get("since", 0) or 0)

        async def stream():
            version = feed.version
            yield f"event: status\ndata: {json.dumps(feed.status())}\n\n"
            last = since
            if run is not None and reader.position and since:  # what was stored between the page's load and now
                version = -1
            while True:
                if version != feed.version:
                    version = feed.version
                    if run is not None:
                        news = await run_in_threadpool(reader.new_points, run, last)
                        last = news["seq"]
                        if news.get("kinds"):
                            yield f"event: points\ndata: {_json(news).body.decode()}\n\n"
                    yield f"event: stored\ndata: {json.dumps(feed.status())}\n\n"
                if not await feed.wait_change(version, KEEPALIVE_S):
                    if await request.is_disconnected():
                        return
                    yield ": keepalive\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    @asynccontextmanager
    async def lifespan(app):
        await feed.start()
        try:
            yield
        finally:
            await feed.stop()
            reader.close()

    routes = [
        Route("/", index),
        Route("/api/status", api_status),
        Route("/api/runs", api_runs),
        Route("/api/run/{run}", api_run),
        Route("/api/run/{run}/series", api_series),
        Route("/api/run/{run}/audit/{suite}", api_audit),
        Route("/api/health", api_health),
        Route("/api/compare", api_compare),
        Route("/api/ladders", api_ladders),
        Route("/api/ladder/{name}", api_ladder),
        Route("/api/sql", api_sql),
        Route("/api/decide", api_decide, methods=["POST"]),
        Route("/api/live", api_live),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    async def bad_input(request: Request, err: Exception) -> Response:  # a run id that is not a name, say
        return _error(400, str(err).splitlines()[0])

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={ValueError: bad_input})
    app.state.reader, app.state.feed, app.state.access = reader, feed, access
    return AccessMiddleware(app, access)

