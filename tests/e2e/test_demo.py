"""`runledger demo --quick` end to end: from the ledger (SQL), (a) the slow first quarter got the
horizon shortened, (b) the context extension was held by the drop agent, (c) the killed worker
resumed from its checkpoint; `verify` passes on what it left; and its transparency log's checkpoint is
cosigned by the demo's own witness, whose policy `runledger tlog audit --policy` holds it to."""

from __future__ import annotations

import json
import re

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
