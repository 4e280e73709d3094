"""`runledger publish`: JSON Lines envelopes (already sealed) from a stream, validated and published.

A bad line is reported with its line number and reason and skipped; every valid line is published
with Nats-Msg-Id = event_id:hash (`bus.msg_id`) and waited on until JetStream acknowledged it (resent on failure), so no
valid line is lost. For building new events in a program, emit typed events into a sink (`runledger.ledger.emit.sink`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.events import InvalidEvent, subject_for
from runledger.ledger.contract.parsing import parse_json
from runledger.ledger.contract.validation import check_envelope

log = logging.getLogger(__name__)

WINDOW = 512
RETRIES = 20


async def publish_lines(lines: Iterable[str | bytes], nats_url: str) -> tuple[list[tuple[int, str]], int]:
    """Publish every valid envelope line; return ([(line number, reason)] for bad lines, published)."""
    bad: list[tuple[int, str]] = []
    valid: list[tuple[str, bytes, str]] = []
    for lineno, line in enumerate(lines, start=1):
        # stdin text keeps undecodable bytes as lone surrogates (surrogateescape): get the bytes back, and let
        # parse_json refuse invalid UTF-8 with this line's number instead of crashing on the encode
        data = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
        if not data.strip():
            continue
        try:
            env = parse_json(data)
            check_envelope(env)
        except InvalidEvent as err:
            bad.append((lineno, str(err)))
            continue
        valid.append((subject_for(env["run_id"], env["kind"]), data.strip(), bus.msg_id(env["event_id"], env["hash"])))
    if valid:
        nc = await bus.connect(nats_url, name="runledger-publish")
        try:
            js = nc.jetstream()
            await bus.ensure_stream(js)
            todo = valid
            for attempt in range(RETRIES):
                todo = await _publish_all(js, todo)
                if not todo:
                    break
                log.warning("%d events not acknowledged; resending (try %d)", len(todo), attempt + 2)
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            if todo:
                raise RuntimeError(f"{len(todo)} valid events could not be published to {nats_url}")
        finally:
            await nc.close()
    return bad, len(valid)


async def _publish_all(js, items: list[tuple[str, bytes, str]]) -> list[tuple[str, bytes, str]]:
    """Publish with a window of acks in flight; return the items that failed."""
    failed = []
    for start in range(0, len(items), WINDOW):
        chunk = items[start:start + WINDOW]
        futs = []
        for subject, data, mid in chunk:
            futs.append(await js.publish_async(subject, data, headers={"Nats-Msg-Id": mid}))
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 30)
        failed += [item for item, r in zip(chunk, results) if isinstance(r, BaseException)]
    return failed
