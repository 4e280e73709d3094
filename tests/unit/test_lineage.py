"""`runledger lineage RUN`: OpenLineage events for a run's start, each attempt and its end, validated against
the OpenLineage spec's JSON Schema, with inputs, outputs and decisions matching the ledger.

openlineage-python ships no JSON Schema file (its classes are generated from the spec), so the spec's
schemas of the version the client writes (OpenLineage.json 2-0-2 and the standard facets used) are kept
in tests/openlineage/, from the OpenLineage repository (Apache-2.0), and runledger's own facets' schema
in interop/facets/.
"""

from __future__ import annotations

import functools
import json

import pytest

from support import REPO
from support.lineage import LINEAGE_RUN, write_ledger
from support.processes import cli
from support.reading import reader

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("openlineage.client")

SPEC = REPO / "tests" / "support" / "openlineage"
FACETS = REPO / "interop" / "facets" / "RunledgerFacets.json"


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
    done = cli("lineage", LINEAGE_RUN, "--root", str(root), "--to", str(out))
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["eventType"] for e in events] == ["START", "OTHER", "RUNNING", "COMPLETE"]
    for e in events:
        check_schema(e)
    assert len({e["run"]["runId"] for e in events}) == 1 and {e["job"]["name"] for e in events} == {LINEAGE_RUN}

    last = events[-1]
    con = reader(root)
    sources = {(s["path"], s["byte_start"], s["byte_end"], s["sha256"], s["domain"])
               for (payload,) in con.execute("select payload from data where run_id = ?", [LINEAGE_RUN]).fetchall()
               for s in json.loads(payload)["sources"]}
    inputs = {(i["name"], i["inputFacets"]["runledger_byteRange"]["byteStart"],
               i["inputFacets"]["runledger_byteRange"]["byteEnd"], i["facets"]["version"]["datasetVersion"].removeprefix("sha256:"),
               i["inputFacets"]["runledger_byteRange"]["domain"]) for i in last["inputs"]}
    assert inputs == sources and len(sources) == 3
    checkpoints = {(p, h, b) for p, h, b in con.execute("select path, content_hash, bytes from checkpoints where run_id = ?",
                                                        [LINEAGE_RUN]).fetchall()}
    outputs = {(o["name"], o["facets"]["version"]["datasetVersion"], o["outputFacets"]["outputStatistics"]["size"])
               for o in last["outputs"]}
    assert outputs == checkpoints and len(checkpoints) == 2
    decisions = con.execute("select decision_id, agent, action, rationale, step from decisions where run_id = ?", [LINEAGE_RUN]).fetchall()
    facet = last["run"]["facets"]["runledger_decisions"]["decisions"]
    assert [(d["decisionId"], d["agent"], d["action"], d["rationale"], d["step"]) for d in facet] == decisions
    assert facet[0]["applied"][0]["status"] == "applied" and facet[0]["applied"][0]["after"] == {"checkpoint_step": 11}

    # each event holds what the ledger held by its time; the attempts say what they resumed from and how they ended
    assert len(events[0]["inputs"]) == 0 and events[0]["run"]["facets"]["runledger_decisions"]["decisions"] == []
    assert events[1]["run"]["facets"]["runledger_attempt"]["finished"]["status"] == "failed"
    assert len(events[1]["outputs"]) == 1 and len(events[1]["inputs"]) == 2
    assert events[2]["run"]["facets"]["runledger_attempt"]["resumedFrom"]["content_hash"] == "h10"
    assert events[2]["run"]["facets"]["runledger_attempt"]["attempt"] == 1


def test_lineage_of_an_unknown_run_is_a_one_line_usage_error(root):
    write_ledger(root)
    done = cli("lineage", "no-such-run", "--root", str(root))
    assert done.returncode == 2 and "no run 'no-such-run'" in done.stderr
