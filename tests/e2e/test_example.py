"""The first example a user reads (`examples/optax_mlp.py`), run as they run it: every value it logged is
in the ledger exactly, at its step, the ledger verifies, and the health audit reads the run's loss.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from runledger.ledger import local
from support import REPO
from support.processes import cli
from support.reading import reader, wait_for_count

# the example's default: the audit's loss trend compares two windows of window_blocks (5) blocks of
# block_steps (100 without a plan: queries/views.sql run_blocks) steps, so it reads a run of >= 1000 steps
STEPS = 1000
LOSS_CHECKS = ("loss_decreasing", "loss_floor", "skipped_steps", "grad_norm_max", "grad_norm_rise", "param_norm_growth",
               "eval_decreasing")


def stored_as(value: float) -> tuple[float | None, str | None]:
    """(value, nonfinite) as the metrics view holds a logged value: JSON has no NaN, so null and its kind."""
    if math.isfinite(value):
        return value, None
    return None, "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def test_the_optax_example_is_recorded_exactly_verifies_and_passes_the_health_audit(local_root, tmp_path):
    dump = tmp_path / "logged.json"
    out = subprocess.run([sys.executable, str(REPO / "examples" / "optax_mlp.py"), "--root", str(local_root),
                          "--steps", str(STEPS), "--name", "optax-mlp-test", "--dump-json", str(dump)],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    logged = json.loads(dump.read_text())
    run_id = logged["run_id"]
    expected = {(int(step), key): stored_as(value) for step, metrics in logged["logged"].items() for key, value in metrics.items()}
    assert run_id.startswith("optax-mlp-test-") and len(logged["logged"]) == STEPS  # (a fresh id made of the name) and len(expected) > 17 * STEPS

    # every key at every step, exactly (float equality), nothing more, nothing doubled
    sql = f"select count(*) from metrics where run_id = '{run_id}'"
    assert wait_for_count(local_root, sql, len(expected)) == len(expected)
    rows = reader(local_root).execute("select step, key, value, nonfinite from metrics where run_id = ?", [run_id]).fetchall()
    assert len(rows) == len(expected)
    assert {(step, key): (value, nonfinite) for step, key, value, nonfinite in rows} == expected
    (config, name), = reader(local_root).execute("select config, name from runs where run_id = ?", [run_id]).fetchall()
    assert json.loads(config)["steps"] == STEPS and name == "optax-mlp-test"
    (status, summary), = reader(local_root).execute("select status, summary from runs_finished where run_id = ?",
                                                    [run_id]).fetchall()
    best = max(m.get("eval/accuracy", 0.0) for m in logged["logged"].values())
    assert status == "completed" and json.loads(summary)["eval/best_accuracy"] == best

    # the stopped ledger's files verify, and the health audit runs its loss checks on the metrics (none skip)
    assert local.down(local_root)
    verified = cli("verify", "--root", str(local_root))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    audit = cli("audit", "health", run_id, "--root", str(local_root), "--format", "json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    status_of = {row["check"]: row["status"] for row in json.loads(audit.stdout)}
    assert {check: status_of[check] for check in LOSS_CHECKS} == {check: "ok" for check in LOSS_CHECKS}
