"""Who relayed each chain a root stores (`runledger push` from another root): `{root}/relays/run_id={run_id}.json`,
per chain (`{producer}:{attempt}`), the relays that carried events of it, each with the root they came
from (its id, as the relay says), the stream they came by and when first seen. On a secure server the
relay's name is a token of its subject that only that `relay` user may publish to
(runledger.ledger.bus.natsserver.permissions), so the record names who carried the events; the events'
hashes, checked on the way in as any event's, prove them unchanged.
Written at the ledger's commit, before the ack; `runledger push` never relays into a chain silently."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

RELAYS_DIR = "relays"


def note(pending: dict, subject: str, good: list[tuple[dict, str]]) -> None:
    """Note the chains of the events `good` that came on relayed `subject` (`...relay.{relay}.{source}`)."""
    relay, source = subject.split(".")[-2:]
    for env, _ in good:
        pending.setdefault((env["run_id"], env["producer"], env["attempt"]), set()).add((relay, source))


def run_file(root: Path, run_id: str) -> Path:
    return Path(root) / RELAYS_DIR / f"run_id={run_id}.json"


def read_run(root: Path, run_id: str) -> dict[str, list[dict]]:
    """`{producer}:{attempt}` -> [{"relay", "from", "stream", "first_seen"}] of one run."""
    try:
        return json.loads(run_file(root, run_id).read_text())
    except (OSError, ValueError):
        return {}


def record(root: Path, pending: dict, stream: str | None) -> None:
    """Add the relays of `pending` ((run_id, producer, attempt) -> relays) to the runs' records."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    by_run: dict[str, dict] = {}
    for (run_id, producer, attempt), names in pending.items():
        by_run.setdefault(run_id, {})[f"{producer}:{attempt}"] = names
    for run_id, chains in by_run.items():
        doc = read_run(root, run_id)
        changed = False
        for chain, names in chains.items():
            known = {(r["relay"], r["from"]) for r in doc.get(chain, [])}
            for name, source in sorted(names - known):
                doc.setdefault(chain, []).append({"relay": name, "from": source, "stream": stream, "first_seen": now})
                changed = True
        if changed:
            path = run_file(root, run_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, path)
