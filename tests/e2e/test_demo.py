"""`runledger demo --quick` end to end: from the ledger (SQL), (a) the slow first quarter got the
horizon shortened, (b) the context extension was held by the drop agent, (c) the killed worker
resumed from its checkpoint; `verify` passes on what it left; and its transparency log's checkpoint is
cosigned by the demo's own witness, whose policy `runledger tlog audit --policy` holds it to."""

from __future__ import annotations

import json
import re
import shutil

from runledger import queries
from support.processes import cli, runledger


PLANTED = {"throughput_floor", "mfu_constant", "mfu_below_plan", "drop_fraction", "attempt_started"}


def test_the_quick_demo_shows_a_b_c_and_verifies(tmp_path):
    root = tmp_path / "demo"
    r = runledger("demo", "--quick", "--root", str(root), timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    con = queries.connect(root)
    one = lambda q: con.execute(q).fetchone()[0]  # noqa: E731
    # (a) decided by the throughput agent, with its evidence, and applied by the worker
    assert one("""select count(*) from decisions d join decisions_applied a using (decision_id)
                  where d.action = 'set_token_horizon' and d.agent = 'agent-throughput' and a.status = 'applied'""") == 1
    new_horizon = json.loads(one("select params from decisions where action = 'set_token_horizon'"))["horizon_steps"]
    assert one("select max(step) from steps where run_id = 'main'") == new_horizon
    # (b) the drop agent held the scheduled extension after probing at the longer length
    assert one("select count(*) from drop_probes where run_id = 'main'") > 0
    assert one("""select count(*) from decisions d join decisions_applied a using (decision_id)
                  where d.action = 'hold_context_extension' and d.agent = 'agent-drops' and a.status = 'applied'""") >= 1
    # (c) attempt 1 resumed from a checkpoint attempt 0 saved; one row per step in `steps`
    assert one("select count(*) from runs where run_id = 'main' and attempt = 1 and resumed_from is not null") == 1
    assert one("select count(*) from steps where run_id = 'main'") == one("select count(distinct step) from steps_all where run_id = 'main'")
    assert cli("verify", "--root", str(root)).returncode == 0
    # issue 43: the main run's health checks warn or fail only where the demo plants it: (a) the slow node
    # (throughput and MFU), (b) the drops over the demo's declared limit, (c) the killed worker's next attempt
    audit = cli("audit", "health", "main", "--root", str(root), "--format", "json")
    fired = {r["check"] for r in json.loads(audit.stdout) if r["status"] in ("warn", "fail")}
    assert fired <= PLANTED, fired - PLANTED
    assert "attempt_started" in fired
    assert (root / "report.html").exists()
    # issue 48: one local witness cosigned the printed checkpoint; the audit required its cosignature
    assert "— witness.demo.local " in r.stdout, r.stdout[-3000:]
    assert "tlog audit --policy: log runledger.local/demo" in r.stdout and "cosigned by demo-witness" in r.stdout
    attested = [ln for ln in r.stdout.splitlines() if ln.startswith("tlog audit --policy: attestations:")]
    assert attested and re.search(r"attestations: [1-9]\d* checked", attested[0]) and "unchecked" not in attested[0], attested
    again = cli("tlog", "audit", "--log", str(root / "tlog"), "--policy", str(root / "tlog-policy.txt"), "--events", str(root))
    assert again.returncode == 0 and "cosigned by demo-witness" in again.stdout, again.stdout + again.stderr
    # issue 47: the same audit on an edited copy of the demo's root fails, naming the edited event
    edited = tmp_path / "edited"
    shutil.copytree(root, edited, symlinks=True)
    name, event_id = _edit_one_step(edited)
    bad = runledger("tlog", "audit", "--log", str(edited / "tlog"), "--policy", str(edited / "tlog-policy.txt"),
                    "--events", str(edited), timeout=300)
    assert bad.returncode == 1 and event_id in bad.stdout + bad.stderr, (name, bad.stdout[-2000:], bad.stderr[-2000:])


def _edit_one_step(root) -> tuple[str, str]:
    """Lower one stored step's loss in place in its Parquet file (what someone holding the root would do to
    make a run look better): the file's name and the edited event's id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from runledger.ledger.storage.paths import event_files

    path = event_files(root, "step", "main")[0]
    t = pq.read_table(path)
    payloads = t.column("payload").to_pylist()
    payload = json.loads(payloads[0])
    payload["loss"] = payload["loss"] / 2
    payloads[0] = json.dumps(payload)
    t = t.set_column(t.schema.get_field_index("payload"), "payload", pa.array(payloads, t.schema.field("payload").type))
    pq.write_table(t, path)
    return path.name, t.column("event_id")[0].as_py()
