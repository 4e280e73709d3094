"""`runledger lineage RUN`: OpenLineage events for a run's start, each attempt and its end, validated against
the OpenLineage spec's JSON Schema, with inputs, outputs and decisions matching the ledger.

openlineage-python ships no JSON Schema file (its classes are generated from the spec), so the spec's
schemas of the version the client writes (OpenLineage.json 2-0-2 and the standard facets used) are kept
in tests/openlineage/, from the OpenLineage repository (Apache-2.0), and runledger's own facets' schema
in interop/facets/.
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import REPO, cli, reader

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("openlineage.client")

SPEC = REPO / "tests" / "openlineage"
FACETS = REPO / "interop" / "facets" / "RunledgerFacets.json"
RUN = "lineage-run"


def write_ledger(root: Path) -> None:
    """A run of two worker attempts (the first fails, the second resumes from its checkpoint) with data,
    checkpoints and an agent's decision that the second attempt applies, by the ledger's own writer."""
    from runledger.ledger.contract.events import (CheckpointAsked, CheckpointSaved, DataRecorded, DataSource, DecisionApplied, DecisionMade, ResumedFrom, RunFinished, RunStarted)
    from runledger.ledger.emit.sink import ParquetSink

    seqs, rows = itertools.count(1), []

    def sink(producer: str, attempt: int) -> ParquetSink:
        return ParquetSink(root, RUN, producer, attempt, stream_seqs=seqs, rows=rows, flush_every=None)

    def at(second: int) -> str:
        return f"2026-11-29T10:00:{second:02d}.000000Z"

    w0, agent, w1 = sink("worker-0", 0), sink("agent-ckpt", 0), sink("worker-0", 1)
    w0.emit(RunStarted(config={"lr": 3e-4}, config_hash="c" * 64), time=at(0))
    w0.emit(DataRecorded(sources=[
        DataSource(domain="web", path="/data/web.bin", sha256="a" * 64, byte_start=0, byte_end=4096),
        DataSource(domain="math", path="domain:math", sha256="b" * 64, byte_start=100, byte_end=900)]), step=0, time=at(1))
    w0.emit(CheckpointSaved(path="/ckpt/step-10", bytes=1234, seconds=0.5, content_hash="h10"), step=10, time=at(5))
    agent.emit(DecisionMade(decision_id="d-1", agent="agent-ckpt", rule="silence", action="checkpoint_now",
                            rationale="telemetry silent", evidence={"rows": 3}), step=12, time=at(6))
    w0.emit(RunFinished(status="failed", reason="node lost"), step=12, time=at(7))
    w1.emit(RunStarted(config={"lr": 3e-4}, config_hash="c" * 64,
                       resumed_from=ResumedFrom(path="/ckpt/step-10", step=10, content_hash="h10")), step=10, time=at(10))
    w1.emit(DataRecorded(sources=[DataSource(domain="web", path="/data/web.bin", sha256="d" * 64, byte_start=4096,
                                             byte_end=8192)]), step=10, time=at(11))
    w1.emit(DecisionApplied(decision_id="d-1", action="checkpoint_now", before=CheckpointAsked(),
                            after=CheckpointAsked(checkpoint_step=11)), step=10, time=at(12))
    w1.emit(CheckpointSaved(path="/ckpt/step-11", bytes=1300, seconds=0.4, content_hash="h11", reason="requested"),
            step=11, time=at(13))
    w1.emit(RunFinished(status="completed", final_step=20), step=20, time=at(20))
    w1.flush()


@functools.cache
def validator():
    """A validator of OpenLineage's RunEvent schema, facets checked against their own schemas too."""
    from referencing import Registry, Resource

    docs = [json.loads(p.read_text()) for p in [*SPEC.glob("*.json"), FACETS]]
    registry = Registry().with_resources((d["$id"], Resource.from_contents(d)) for d in docs)
    core = next(d for d in docs if d["$id"].endswith("/OpenLineage.json"))
    return core, registry


def check_schema(event: dict) -> None:
    core, registry = validator()
    jsonschema.Draft202012Validator(core, registry=registry, format_checker=jsonschema.FormatChecker()).validate(event)
    facets = [*event["run"]["facets"].values(), *event["job"]["facets"].values()]
    for ds in event["inputs"] + event["outputs"]:
        facets += [*ds.get("facets", {}).values(), *ds.get("inputFacets", {}).values(), *ds.get("outputFacets", {}).values()]
    for facet in facets:  # each facet against the schema its _schemaURL names
        jsonschema.Draft202012Validator({"$ref": facet["_schemaURL"]}, registry=registry).validate(facet)


def test_lineage_events_validate_and_match_the_ledger(root, tmp_path):
    write_ledger(root)
    out = tmp_path / "lineage.jsonl"
    done = cli("lineage", RUN, "--root", str(root), "--to", str(out))
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "OTHER", "RUNNING", "COMPLETE"]
    for e in events:
        check_schema(e)
    assert len({e["run"]["runId"] for e in events}) == 1 and {e["job"]["name"] for e in events} == {RUN}

    last = events[-1]
    con = reader(root)
    sources = {(s["path"], s["byte_start"], s["byte_end"], s["sha256"], s["domain"])
               for (payload,) in con.execute("select payload from data where run_id = ?", [RUN]).fetchall()
               for s in json.loads(payload)["sources"]}
    inputs = {(i["name"], i["inputFacets"]["runledger_byteRange"]["byteStart"],
               i["inputFacets"]["runledger_byteRange"]["byteEnd"], i["facets"]["version"]["datasetVersion"].removeprefix("sha256:"),
               i["inputFacets"]["runledger_byteRange"]["domain"]) for i in last["inputs"]}
    assert inputs == sources and len(sources) == 3
    checkpoints = {(p, h, b) for p, h, b in con.execute("select path, content_hash, bytes from checkpoints where run_id = ?",
                                                        [RUN]).fetchall()}
    outputs = {(o["name"], o["facets"]["version"]["datasetVersion"], o["outputFacets"]["outputStatistics"]["size"])
               for o in last["outputs"]}
    assert outputs == checkpoints and len(checkpoints) == 2
    decisions = con.execute("select decision_id, agent, action, rationale, step from decisions where run_id = ?", [RUN]).fetchall()
    facet = last["run"]["facets"]["runledger_decisions"]["decisions"]
    assert [(d["decisionId"], d["agent"], d["action"], d["rationale"], d["step"]) for d in facet] == decisions
    assert facet[0]["applied"][0]["status"] == "applied" and facet[0]["applied"][0]["after"] == {"checkpoint_step": 11}

    # each event holds what the ledger held by its time; the attempts say what they resumed from and how they ended
    assert len(events[0]["inputs"]) == 0 and events[0]["run"]["facets"]["runledger_decisions"]["decisions"] == []
    assert events[1]["run"]["facets"]["runledger_attempt"]["finished"]["status"] == "failed"
    assert len(events[1]["outputs"]) == 1 and len(events[1]["inputs"]) == 2
    assert events[2]["run"]["facets"]["runledger_attempt"]["resumedFrom"]["content_hash"] == "h10"
    assert events[2]["run"]["facets"]["runledger_attempt"]["attempt"] == 1


def test_lineage_posts_with_the_clients_http_transport(root):
    write_ledger(root)
    received = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = cli("lineage", RUN, "--root", str(root), "--to", f"http://127.0.0.1:{server.server_port}/api/v1/lineage")
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert [p for p, _ in received] == ["/api/v1/lineage"] * 4
    assert [e["eventType"] for _, e in received] == ["START", "OTHER", "RUNNING", "COMPLETE"]


def test_lineage_of_an_unknown_run_is_a_one_line_usage_error(root):
    write_ledger(root)
    done = cli("lineage", "no-such-run", "--root", str(root))
    assert done.returncode == 2 and "no run 'no-such-run'" in done.stderr
