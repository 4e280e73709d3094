"""The operators' view of a partitioned root (`runledger status`): per partition its writer, lag,
stored position, last commit and takeovers; a root served by a single ledger is one partition."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from datetime import datetime, timezone
from pathlib import Path

from runledger.ledger.contract.events import STREAM
from runledger.ledger.ingest.partitions.parts import Part, lease_bucket, parts_stream
from runledger.ledger.ingest.partitions.root import layout
from runledger.ledger.storage.positions import read_position

log = logging.getLogger(__name__)


async def figures(root: str | Path, nats_url: str | None, timeout: float = 5.0) -> dict:
    """Per partition: its writer (the lease holder, live from NATS; else the status record's), its lag
    (messages of the partition not yet stored: the partitioned consumer's pending and unacked, live;
    else as of the writer's last fetch), its stored position (RUNLEDGER seq) and its last commit (time,
    ledger snapshot number), and the takeovers recorded. A root served by a single ledger is one
    partition whose lag is its consumer `ledger`'s. `live` says whether NATS answered."""
    from runledger.ledger.bus import jetstream as bus

    root = Path(root)
    k = layout(root)
    rows = []
    for p in range(k or 1):
        part = Part(k, p) if k else None
        doc = part.read_status(root) if part else {}
        takeovers = doc.get("takeovers", [])
        rows.append({"partition": p, "writer": doc.get("writer"), "renewed": doc.get("renewed"),
                     "position": part.load(root) if part else read_position(root),
                     "pending": doc.get("backlog"), "last_commit": doc.get("last_commit"),
                     "takeovers": len(takeovers), "longest_gap_s": max((t["gap_s"] for t in takeovers), default=None)})
    live = False
    if nats_url:
        try:
            if not await bus.listening(nats_url):
                raise ConnectionRefusedError("no server listens there")
            nc = await asyncio.wait_for(bus.connect(nats_url, name="runledger-status", max_reconnect_attempts=0,
                                                    allow_reconnect=False), timeout)
        except Exception as err:
            log.warning("NATS at %s did not answer (%s): figures as last recorded", nats_url, err)
        else:
            try:
                js = nc.jetstream()
                if k:
                    kv = await js.key_value(lease_bucket(k))
                for row in rows:
                    if k:
                        part = Part(k, row["partition"])
                        try:
                            row["writer"] = json.loads((await kv.get(part.key)).value)["holder"]
                        except Exception:  # no lease: no writer now
                            row["writer"] = None
                        info = await js.consumer_info(parts_stream(k), part.durable)
                    else:
                        from runledger.ledger.ingest.position import DURABLE

                        info = await js.consumer_info(STREAM, DURABLE)
                    row["pending"] = info.num_pending + info.num_ack_pending
                live = True
            except Exception as err:
                log.warning("NATS did not give every figure (%s): the rest as last recorded", err)
            finally:
                await nc.close()
    if not k:
        rows[0]["last_commit"] = last_commit(root)
        rows[0]["writer"] = lock_holder(root)
    return {"root": str(root), "partitions_total": k or 1, "live": live, "partitions": rows}


def lock_holder(root: Path) -> str | None:
    """The single ledger of a root, as its lock file names it, if that process is alive on this host (the
    lock is not probed: taking it for a moment could make a ledger starting just then refuse to)."""
    try:
        who = json.loads((Path(root) / "ledger.lock").read_text() or "null") or {}
        if who.get("host") == socket.gethostname():
            os.kill(int(who["pid"]), 0)
        return f"{who['host']}:{who['pid']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def last_commit(root: Path) -> list | None:
    """(time, ledger snapshot number) of the root's last commit, from its tables (a single ledger): the
    time is that of the newest file the current snapshot holds (written just before its commit)."""
    from runledger.ledger.storage import paths

    try:
        cut = paths.cut(root)
    except Exception:
        return None
    files = [f.path for listed in cut.files.values() for f in listed if f.path.exists()]
    if not files:
        return None
    newest = max(f.stat().st_mtime for f in files)
    return [datetime.fromtimestamp(newest, timezone.utc).isoformat(timespec="milliseconds"), cut.commit]
