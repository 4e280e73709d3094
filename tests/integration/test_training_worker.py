"""The worker: a run interrupted and resumed ends with the same params and losses as an
uninterrupted one; a non-finite loss is skipped, not fatal; a fork records its parent; the lr in
force is the optimizer's; every emitted payload is valid for its kind."""

import dataclasses

import jax
import numpy as np
import pytest

from runledger.ledger.emit.sink import ListSink
from runledger.training import checkpoint
from runledger.training.config import PRESETS, config_hash, from_dict
from runledger.training.schedule import lr_at, retime
from runledger.training.worker import Start, train

CFG = dataclasses.replace(PRESETS["tiny"], steps=8, eval_every=4, ckpt_every=4, log_every=4)
PEAK = 1e11  # a fixed peak keeps the tests from measuring the machine


def _same_params(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    rec = ListSink()
    res = train(CFG, run_id="whole", ckpt_dir=tmp_path_factory.mktemp("whole"), sink=rec, peak_flops=PEAK,
                nan_steps=frozenset({3}))
    return res, rec


def test_an_uninterrupted_run_emits_every_kind(uninterrupted):
    res, rec = uninterrupted
    kinds = [k for k, _, _ in rec.events]
    assert kinds[:2] == ["run_started", "data"] and kinds[-1] == "run_finished"
    assert [s for s, _ in rec.payloads("step")] == list(range(1, 9)) == [s for s, _ in rec.payloads("drops")]
    assert [s for s, _ in rec.payloads("eval")] == [4, 8]
    assert [(s, p["reason"]) for s, p in rec.payloads("checkpoint")] == [(4, "periodic"), (8, "final")]
    started = rec.payloads("run_started")[0][1]
    assert started["config_hash"] == config_hash(CFG) and from_dict(started["config"]) == CFG
    assert started["token_budget"] == CFG.token_budget and started["peak_flops"] == PEAK
    drops = rec.payloads("drops")[0][1]
    assert len(drops["layers"]) == CFG.model.n_layers
    assert drops["assignments"] == CFG.tokens_per_step * CFG.moe.top_k * CFG.model.n_layers
    assert rec.payloads("run_finished")[0][1]["status"] == "completed"


def test_a_non_finite_loss_skips_the_update_and_is_recorded(uninterrupted):
    res, rec = uninterrupted
    step3 = dict(rec.payloads("step"))[3]
    assert step3["skipped"] is True and step3["loss"] is None
    assert res.losses[3] is None and all(res.losses[k] is not None for k in (1, 2, 4))
    assert not any(p["skipped"] for s, p in rec.payloads("step") if s != 3)


def test_the_lr_in_force_is_the_schedules(uninterrupted):
    _, rec = uninterrupted
    sched = rec.payloads("run_started")[0][1]["schedule"]
    for s, p in rec.payloads("step"):
        assert p["lr"] == pytest.approx(lr_at(s, **sched), rel=1e-6)


def test_an_interrupted_and_resumed_run_ends_like_the_uninterrupted_one(uninterrupted, tmp_path):
    whole, _ = uninterrupted
    first = train(CFG, run_id="split", ckpt_dir=tmp_path, steps=5, peak_flops=PEAK, nan_steps=frozenset({3}))
    assert first.final_step == 5
    meta = checkpoint.latest(tmp_path, at_or_before=4)
    assert meta["step"] == 4  # the periodic checkpoint; step 5 is lost with the "crash"
    rec = ListSink()
    second = train(CFG, run_id="split", ckpt_dir=tmp_path, sink=rec, peak_flops=PEAK, nan_steps=frozenset({3}),
                   start=Start(attempt=1, checkpoint_path=meta["path"], step=meta["step"], schedule=meta["schedule"],
                               content_hash=meta["content_hash"]))
    assert sorted(second.losses) == [5, 6, 7, 8]
    for k in range(5, 9):
        assert second.losses[k] == whole.losses[k]
    _same_params(second.state["params"], whole.state["params"])
    started = rec.payloads("run_started")[0]
    assert started[0] == 4 and started[1]["resumed_from"]["content_hash"] == meta["content_hash"]


def test_a_fork_records_its_parent_and_can_retime_its_schedule(uninterrupted, tmp_path):
    whole, _ = uninterrupted
    parent = whole.checkpoints[0]
    sched = retime(checkpoint.read_meta(parent["path"])["schedule"], parent["step"], 7)  # early cooldown
    rec = ListSink()
    fork = train(CFG, run_id="branch", ckpt_dir=tmp_path, sink=rec, peak_flops=PEAK, steps=7,
                 start=Start(checkpoint_path=parent["path"], schedule=sched,
                             parent={"run_id": "whole", "step": parent["step"], "content_hash": parent["content_hash"]}))
    started = rec.payloads("run_started")[0][1]
    assert started["parent"]["run_id"] == "whole" and started["resumed_from"] is None
    assert sorted(fork.losses) == [5, 6, 7]
    assert dict(rec.payloads("step"))[7]["lr"] == pytest.approx(CFG.optim.peak_lr * CFG.optim.min_lr_ratio)


def test_a_corrupted_checkpoint_is_refused(uninterrupted):
    whole, _ = uninterrupted
    info = whole.checkpoints[0]
    with pytest.raises(ValueError, match="content hash"):
        checkpoint.restore(info["path"], whole.state, expect_hash="0" * 64)


def test_decisions_are_carried_out_at_step_boundaries(tmp_path):
    plan = {
        2: [{"decision_id": "d-horizon", "action": "set_token_horizon", "params": {"horizon_tokens": 7 * CFG.tokens_per_step}},
            {"decision_id": "d-nohorizon", "action": "set_token_horizon", "params": {"horizon_steps": 1}}],
        3: [{"decision_id": "d-ckpt", "action": "checkpoint_now", "params": {}},
            {"decision_id": "d-bad", "action": "hold_context_extension", "params": {}}],
    }
    rec = ListSink()
    res = train(CFG, run_id="decided", ckpt_dir=tmp_path, sink=rec, peak_flops=PEAK,
                decisions=lambda step: plan.get(step, []))
    assert res.final_step == 7  # the horizon moved from 8 to 7 (two decay steps left: the least a retime takes)
    applied = {p["decision_id"]: (s, p) for s, p in rec.payloads("decision_applied")}
    assert applied["d-horizon"][0] == 2 and applied["d-horizon"][1]["after"]["horizon_steps"] == 7
    assert applied["d-nohorizon"][1]["status"] == "refused"  # a horizon in the past
    assert applied["d-bad"][1]["status"] == "refused"
    assert [(s, p["reason"]) for s, p in rec.payloads("checkpoint")] == [(3, "requested"), (4, "periodic"), (7, "final")]
    steps = dict(rec.payloads("step"))
    assert steps[7]["lr"] == pytest.approx(CFG.optim.peak_lr * CFG.optim.min_lr_ratio)
    assert rec.payloads("run_finished")[0][1]["final_step"] == 7


def test_a_stop_request_ends_the_run_at_a_step_boundary_with_a_checkpoint(tmp_path):
    rec = ListSink()
    done = []
    res = train(CFG, run_id="stopped", ckpt_dir=tmp_path, sink=rec, peak_flops=PEAK,
                should_stop=lambda: (done.append(1) or len(done)) > 3)
    assert res.status == "stopped" and res.final_step == 3
    assert [(s, p["reason"]) for s, p in rec.payloads("checkpoint")] == [(3, "final")]
    assert rec.payloads("run_finished")[0][1]["status"] == "stopped"


def test_a_resumed_run_holds_and_releases_its_context_extension_where_its_past_did(tmp_path):
    """Issue 43: the demo's resumed worker was not told of the hold in force (a decision answered before, never
    handed out again) and trained at the longer length from its first step, which its past never did. Attempt 0
    holds an extension scheduled at step 2, releases it before update 6 and stops after 7; attempt 1, resumed
    from the checkpoint at 4 with the holds replayed from the ledger, trains 5 at 64 and 6-7 at 128 as it did."""
    from runledger.ledger.contract import decision_state
    from runledger.training.resume import extension_holds

    plan = {1: [{"decision_id": "d-hold", "action": "hold_context_extension", "params": {}}],
            5: [{"decision_id": "d-release", "action": "release_context_extension", "params": {}}]}
    first, again = ListSink(), ListSink()
    train(CFG, run_id="held", ckpt_dir=tmp_path, sink=first, peak_flops=PEAK, steps=7, extend=(2, 128),
          decisions=lambda step: plan.get(step, []))
    decisions = {}
    for step, p in first.payloads("decision_applied"):
        decision_state.fold_applied(decisions, p, step)
    holds = extension_holds(decisions)
    assert holds == ((1, True), (5, False))
    meta = checkpoint.latest(tmp_path, at_or_before=4)
    train(CFG, run_id="held", ckpt_dir=tmp_path, sink=again, peak_flops=PEAK, steps=7, extend=(2, 128),
          start=Start(attempt=1, checkpoint_path=meta["path"], step=4, schedule=meta["schedule"],
                      content_hash=meta["content_hash"], extension_holds=holds))

    def lengths(rec):
        return {s: p["seq_len"] for s, p in rec.payloads("drops") if not p.get("probe")}

    assert lengths(first) == {1: 64, 2: 64, 3: 64, 4: 64, 5: 64, 6: 128, 7: 128}
    assert lengths(again) == {5: 64, 6: 128, 7: 128}
    losses = [{s: p["loss"] for s, p in rec.payloads("step") if s >= 5} for rec in (first, again)]
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)  # the replay is exact: resume_matches' 0.002 holds
