"""The transparency log's public files, served as C2SP tlog-tiles names them: `/tlog/checkpoint`,
`/tlog/tile/<L>/<N>[.p/<W>]`, `/tlog/tile/entries/<N>[.p/<W>]` (a partitioned ledger's under
`/tlog/p{N}/`), so any tile client reads the log over HTTP, and the checkpoints' RFC 3161 timestamps
`/tlog/timestamp/<size>.tsr`. Static, size-bounded reads meant for
anyone: no token, no header (runledger.ui.access lets every path outside /api/ through), any origin
may read them (CORS *). Nothing else under the root is reachable: the path must be one of those names."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from runledger.ledger.tlog import log, proofs, tiles

PATH = re.compile(r"^(p\d{1,4}/)?(checkpoint|tile/(\d{1,2}|entries)/(x\d{3}/)*\d{3}(\.p/\d{1,3})?|timestamp/\d{1,20}\.tsr)$")
IMMUTABLE = "public, max-age=31536000, immutable"  # tlog-tiles: tiles and bundles never change
MUTABLE = "public, max-age=2"  # tlog-tiles: the checkpoint SHOULD not be cached beyond a few seconds


def tlog_route(root: str | Path):
    base = log.log_dir(Path(root))

    async def serve(request: Request) -> Response:
        rel = request.path_params["path"]
        if not PATH.match(rel):
            return PlainTextResponse("not a tlog-tiles path", status_code=404)
        path = base / rel
        try:
            if isinstance(path, Path):
                with open(path, "rb") as f:
                    data = f.read(tiles.MAX_READ + 1)
            else:  # (beside the tables on object storage)
                data = await run_in_threadpool(path.read_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return PlainTextResponse("not found", status_code=404)
        if len(data) > tiles.MAX_READ:
            return PlainTextResponse("larger than any tile", status_code=404)
        checkpoint = rel.endswith(tiles.CHECKPOINT)
        kind = "application/timestamp-reply" if rel.endswith(".tsr") else "application/octet-stream"
        return Response(data, media_type="text/plain; charset=utf-8" if checkpoint else kind,
                        headers={"cache-control": MUTABLE if checkpoint else IMMUTABLE,
                                 "access-control-allow-origin": "*"})

    return serve


def proof_route(root: str | Path):
    """/api/tlog/proof/EVENT_ID: the event's C2SP tlog-proof (text/plain), 404 with the reason if none."""
    async def proof(request: Request) -> Response:
        event_id = request.path_params["event_id"]
        if not re.fullmatch(r"[A-Za-z0-9._:-]{1,200}", event_id):
            return PlainTextResponse("not an event id", status_code=400)
        try:
            text = await run_in_threadpool(proofs.prove, root, event_id)
        except proofs.NotProved as err:
            return PlainTextResponse(str(err), status_code=404)
        return PlainTextResponse(text)

    return proof
