"""The audits over what the real training worker emits: a run, the same run interrupted and
resumed, a fork with a retimed schedule and a run whose horizon a decision shortened; the SQL
schedule agrees with the worker's lr at every step, the config matches, and each attempt's
checkpoint lineage is found in the ledger."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("jax")

from runledger.ledger.emit.sink import ParquetSink  # noqa: E402
from runledger.queries import audit  # noqa: E402
from runledger.training import checkpoint  # noqa: E402
from runledger.training.config import PRESETS  # noqa: E402
from runledger.training.schedule import retime  # noqa: E402
from runledger.training.worker import Start, train  # noqa: E402

pytestmark = pytest.mark.slow

CFG = dataclasses.replace(PRESETS["tiny"], steps=8, eval_every=4, ckpt_every=4, log_every=4)
PEAK = 1e11  # a fixed peak keeps the run from measuring the machine


def run(worker_root, run_id, ckpts, attempt=0, **kw):
    with ParquetSink(worker_root, run_id, "worker-0", attempt) as sink:
        return train(CFG, run_id=run_id, ckpt_dir=ckpts, sink=sink, peak_flops=PEAK, **kw)


@pytest.fixture(scope="module")
def worker_root(tmp_path_factory):
    base = tmp_path_factory.mktemp("worker")
    worker_root = base / "ledger"
    whole = run(worker_root, "whole", base / "whole", nan_steps=frozenset({3}))
    run(worker_root, "split", base / "split", steps=5)
    meta = checkpoint.latest(base / "split", at_or_before=4)
    run(worker_root, "split", base / "split", attempt=1,
        start=Start(attempt=1, checkpoint_path=meta["path"], step=meta["step"], schedule=meta["schedule"],
                    content_hash=meta["content_hash"]))
    parent = whole.checkpoints[0]
    sched = retime(checkpoint.read_meta(parent["path"])["schedule"], parent["step"], 7)
    run(worker_root, "branch", base / "branch", steps=7,
        start=Start(checkpoint_path=parent["path"], schedule=sched,
                    parent={"run_id": "whole", "step": parent["step"], "content_hash": parent["content_hash"]}))
    # an agent shortens the horizon to 7 after update 4; the worker retimes the decay before update 5
    shorten = {"decision_id": "d-1", "action": "set_token_horizon", "params": {"horizon_steps": 7}}
    run(worker_root, "shortened", base / "shortened", decisions=lambda k: [shorten] if k == 4 else [])
    return worker_root


@pytest.mark.parametrize("run_id", ["whole", "split", "branch", "shortened"])
def test_the_worker_s_lr_and_config_pass_the_audit(worker_root, run_id):
    health = {r["check"]: r for r in audit.run_suite(worker_root, "health", run_id).rows()}
    assert health["lr_schedule"]["status"] == "ok", health["lr_schedule"]
    assert health["config_match"]["status"] == "ok", health["config_match"]
    assert health["telemetry_silence"]["status"] == "ok"
    assert health["skipped_steps"]["status"] == "ok"


def test_the_lr_follows_the_horizon_decision_the_worker_applied(worker_root):
    row = {r["check"]: r for r in audit.run_suite(worker_root, "health", "shortened").rows()}["lr_schedule"]
    evidence = json.loads(row["evidence"])
    assert row["status"] == "ok" and evidence["retimes_applied"] == 1 and evidence["steps_checked"] == 7, row  # to horizon 7


def test_the_skipped_step_is_seen_and_each_start_s_checkpoint_found(worker_root):
    health = {r["check"]: r for r in audit.run_suite(worker_root, "health", "whole").rows()}
    assert health["skipped_steps"]["value"] == 1  # the poisoned step 3
    for run_id, kind in (("split", "resume"), ("branch", "fork")):
        prov = audit.run_suite(worker_root, "provenance", run_id)
        lineage = [dict(zip(r.columns, row)) for r in prov.results if r.name.endswith("lineage") for row in r.rows]
        started = [r for r in lineage if r["start_kind"] == kind]
        assert len(started) == 1 and started[0]["lineage"] == "matches a saved checkpoint", lineage
