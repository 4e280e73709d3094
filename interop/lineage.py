"""A run's lineage as OpenLineage events, built with the openlineage-python client from what the ledger holds.

One OpenLineage run per ledger run (its runId a UUID derived from the run id, so the same run always
gets the same one), job `{namespace}/{run_id}`:

- START at the first `run_started`; RUNNING at each later one (a resumed or restarted attempt; its
  `resumed_from` in the attempt facet); OTHER at a `run_finished` that a later attempt followed; and
  COMPLETE, FAIL or ABORT (completed, failed, stopped) at the last `run_finished`, if there is one.
- Inputs: the data sources of the run's `data` events, one dataset per (path, byte range), with the
  range's sha256 as the dataset version and the range and domain in the `runledger_byteRange` input facet.
- Outputs: the checkpoints, the content hash as the dataset version, the bytes in the standard
  output statistics, step and reason in the `runledger_checkpoint` output facet.
- Decisions (agents' and people's, with how each was applied) in the `runledger_decisions` run facet.

Each event carries what the ledger held by its time: a START lists the inputs, outputs and decisions
recorded before it, the last event all of them. The custom facets' JSON Schemas are in
interop/facets/RunledgerFacets.json, published at FACET_SCHEMA (their `_schemaURL`).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attr
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState, set_producer
from openlineage.client.facet_v2 import (
    InputDatasetFacet, OutputDatasetFacet, RunFacet, dataset_version_dataset, job_type_job,
    output_statistics_output_dataset, processing_engine_run,
)
from openlineage.client.serde import Serde

from runledger.interop import webhook

PRODUCER = "https://github.com/runledger/runledger/tree/main/interop/lineage.py"  # who made the events
FACET_SCHEMA = "https://github.com/runledger/runledger/blob/main/interop/facets/RunledgerFacets.json"
RUN_NAMESPACE = uuid.UUID("6b0c5a3e-2f1d-5c55-9a8e-72756e6c6467")  # uuid5 namespace of runledger runs' OpenLineage ids
STATUS = {"completed": RunState.COMPLETE, "failed": RunState.FAIL, "stopped": RunState.ABORT}


class NoRun(ValueError):
    """The ledger holds no run of that id: the one-line reason."""


@attr.define
class DecisionsRunFacet(RunFacet):
    """Contingency decisions about the run (an agent's or a person's), each with how it was applied."""

    decisions: list[dict] = attr.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return f"{FACET_SCHEMA}#/$defs/DecisionsRunFacet"


@attr.define
class AttemptRunFacet(RunFacet):
    """The attempt of the run an event is about: its producer and number, and what it resumed from."""

    attempt: int
    ledgerProducer: str  # noqa: N815 (the ledger's producer name; `producer` is the facet's own _producer)
    startedAt: str  # noqa: N815 (OpenLineage's camelCase)
    resumedFrom: dict | None = attr.field(default=None)  # noqa: N815
    finished: dict | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return f"{FACET_SCHEMA}#/$defs/AttemptRunFacet"


@attr.define
class ByteRangeInputDatasetFacet(InputDatasetFacet):
    """The bytes of a data source the run read: [byteStart, byteEnd), their sha256, the domain."""

    byteStart: int  # noqa: N815
    byteEnd: int  # noqa: N815
    sha256: str
    domain: str

    @staticmethod
    def _get_schema() -> str:
        return f"{FACET_SCHEMA}#/$defs/ByteRangeInputDatasetFacet"


@attr.define
class CheckpointOutputDatasetFacet(OutputDatasetFacet):
    """A checkpoint the run saved: at which step, why, and its content hash."""

    step: int | None
    reason: str
    contentHash: str  # noqa: N815
    tokensSeen: int | None = attr.field(default=None)  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return f"{FACET_SCHEMA}#/$defs/CheckpointOutputDatasetFacet"


def run_uuid(run_id: str) -> str:
    """The OpenLineage runId of a ledger run (the same every time)."""
    return str(uuid.uuid5(RUN_NAMESPACE, run_id))


def dataset_address(path: str) -> tuple[str, str]:
    """(namespace, name) of a path or URI, as OpenLineage names datasets: file:///a/b -> ("file", "/a/b")."""
    parts = urlsplit(path)
    if parts.scheme and parts.netloc:
        return f"{parts.scheme}://{parts.netloc}", parts.path or "/"
    if parts.scheme == "file" or path.startswith("/"):
        return "file", parts.path if parts.scheme else path
    return "runledger", path  # e.g. "domain:math", the trainer's synthetic domains


def _rows(con, view: str, run_id: str) -> list[dict]:
    cur = con.execute(f"select producer, attempt, seq, step, time, ts, payload from {view} where run_id = ? "
                      "order by ts, stream_seq, seq", [run_id])
    cols = [d[0] for d in cur.description]
    return [{**dict(zip(cols, r)), "payload": json.loads(r[-1])} for r in cur.fetchall()]


def ledger_facts(root: str | Path, run_id: str) -> dict[str, list[dict]]:
    """The run's rows the lineage is made of: starts, finishes, data, checkpoints, decisions and applications."""
    from runledger import queries

    con = queries.connect(root)
    try:
        facts = {name: _rows(con, view, run_id) for name, view in (
            ("started", "runs"), ("finished", "runs_finished"), ("data", "data"), ("checkpoints", "checkpoints"),
            ("decisions", "decisions"), ("applied", "decisions_applied"))}
    finally:
        con.close()
    if not facts["started"]:
        raise NoRun(f"no run {run_id!r} under {root} (no run_started)")
    return facts


def _inputs(data: list[dict], upto) -> list[InputDataset]:
    seen, out = set(), []
    for row in data:
        if row["ts"] > upto:
            continue
        for s in row["payload"].get("sources", []):
            key = (s["path"], s["byte_start"], s["byte_end"], s["sha256"])
            if key in seen:
                continue
            seen.add(key)
            namespace, name = dataset_address(s["path"])
            out.append(InputDataset(
                namespace, name,
                facets={"version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=f"sha256:{s['sha256']}")},
                inputFacets={"runledger_byteRange": ByteRangeInputDatasetFacet(
                    byteStart=s["byte_start"], byteEnd=s["byte_end"], sha256=s["sha256"], domain=s["domain"])}))
    return out


def _outputs(checkpoints: list[dict], upto) -> list[OutputDataset]:
    out = []
    for row in checkpoints:
        if row["ts"] > upto:
            continue
        c = row["payload"]
        namespace, name = dataset_address(c["path"])
        out.append(OutputDataset(
            namespace, name,
            facets={"version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=c["content_hash"])},
            outputFacets={
                "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(size=c["bytes"]),
                "runledger_checkpoint": CheckpointOutputDatasetFacet(
                    step=row["step"], reason=c.get("reason", "periodic"), contentHash=c["content_hash"],
                    tokensSeen=c.get("tokens_seen"))}))
    return out


def _decisions(decisions: list[dict], applied: list[dict], upto) -> list[dict]:
    applications = {}
    for row in applied:
        if row["ts"] <= upto:
            a = row["payload"]
            applications.setdefault(a["decision_id"], []).append(
                {"status": a.get("status", "applied"), "step": row["step"], "time": row["time"], "before": a.get("before", {}),
                 "after": a.get("after", {}), **({"reason": a["reason"]} if a.get("reason") else {})})
    out = []
    for row in decisions:
        if row["ts"] <= upto:
            d = row["payload"]
            out.append({"decisionId": d["decision_id"], "agent": d["agent"], "rule": d["rule"], "action": d["action"],
                        "params": d.get("params", {}), "rationale": d["rationale"], "mode": d.get("mode", "auto"),
                        "step": row["step"], "time": row["time"], "producer": row["producer"],
                        "applied": applications.get(d["decision_id"], [])})
    return out


def events_of(root: str | Path, run_id: str, namespace: str = "runledger") -> list[RunEvent]:
    """The run's OpenLineage events (see the module docstring), in time order."""
    facts = ledger_facts(root, run_id)
    set_producer(PRODUCER)  # (the client's default for every facet made below: ours, not the client's)
    job = Job(namespace, run_id, facets={"jobType": job_type_job.JobTypeJobFacet(
        processingType="BATCH", integration="RUNLEDGER", jobType="TRAINING")})
    engine = processing_engine_run.ProcessingEngineRunFacet(version=_version(), name="runledger")
    marks = [(r["ts"], 0, "start", r) for r in facts["started"]] + [(r["ts"], 1, "finish", r) for r in facts["finished"]]
    marks.sort(key=lambda m: (m[0], m[1], m[3]["seq"]))
    last_finish = max((m for m in marks if m[2] == "finish"), default=None, key=lambda m: (m[0], m[3]["seq"]))
    events, starts = [], 0
    attempts: dict[tuple[str, int], dict] = {}
    for ts, _, what, row in marks:
        p = row["payload"]
        chain = (row["producer"], row["attempt"])
        if what == "start":
            attempts[chain] = {"startedAt": row["time"], "resumedFrom": p.get("resumed_from")}
            state = RunState.START if starts == 0 else RunState.RUNNING
            starts += 1
            finished = None
        else:
            state = STATUS[p["status"]] if (ts, 1, what, row) == last_finish else RunState.OTHER
            finished = {"status": p["status"], "time": row["time"], "step": row["step"],
                        **{k: p[k] for k in ("final_step", "final_loss", "reason") if p.get(k) is not None}}
        started = attempts.get(chain, {"startedAt": row["time"], "resumedFrom": None})
        facets = {"processing_engine": engine,
                  "runledger_attempt": AttemptRunFacet(attempt=row["attempt"], ledgerProducer=row["producer"],
                                                       startedAt=started["startedAt"], resumedFrom=started["resumedFrom"],
                                                       finished=finished),
                  "runledger_decisions": DecisionsRunFacet(decisions=_decisions(facts["decisions"], facts["applied"], ts))}
        events.append(RunEvent(eventType=state, eventTime=row["time"], run=Run(runId=run_uuid(run_id), facets=facets),
                               job=job, producer=PRODUCER, inputs=_inputs(facts["data"], ts),
                               outputs=_outputs(facts["checkpoints"], ts)))
    return events


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("runledger")
    except PackageNotFoundError:
        return "unknown"


def json_lines(events: list[RunEvent]) -> list[str]:
    """Each event as one line of JSON (the client's own serialization)."""
    return [Serde.to_json(e) for e in events]


def as_dicts(events: list[RunEvent]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in json_lines(events)]


def post(events: list[RunEvent], url: str, timeout: float = 10.0) -> None:
    """Send the events, one POST each of the client's own JSON, to an OpenLineage HTTP endpoint (`url`: the
    server, or the server and its endpoint path; default path api/v1/lineage). Each request ends within
    `timeout` in all and is sent to that URL only (runledger.interop.webhook: no redirect followed); the first that
    is not taken raises webhook.NotDelivered, whose message holds no part of the URL past its port."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        url = urlunsplit(parts._replace(path="/api/v1/lineage"))
    for line in json_lines(events):
        webhook.post(url, line.encode(), {"Content-Type": "application/json"}, timeout)
