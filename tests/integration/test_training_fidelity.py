"""Training fidelity: after a context extension each step's MFU counts the FLOPs per token of the
length it trained at (and the step says which), the throughput audit holds a healthy run to its
planned FLOP rate rather than its tokens/s, and a retimed horizon inside warmup is refused."""

from __future__ import annotations

import dataclasses

import pytest

from runledger.ledger.emit.sink import ListSink  # noqa: E402
from runledger.training.config import PRESETS  # noqa: E402
from runledger.training.flops import flops_per_token  # noqa: E402
from runledger.training.worker import train  # noqa: E402

CFG = dataclasses.replace(PRESETS["tiny"], steps=8, eval_every=100, ckpt_every=100, log_every=100)
PEAK = 1e11  # a fixed peak keeps the tests from measuring the machine
EXTEND = (4, 4 * CFG.model.seq_len)  # before update 4, sequences 4x as long (same tokens per step)
INSIDE_WARMUP = 3  # a horizon step before the end of CFG's warmup (5 steps)


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """6 updates of tiny, extended 4x before update 4, and a horizon decision inside warmup after update 1."""
    rec = ListSink()

    def decisions(step):
        if step == 1:
            return [{"decision_id": "d-warmup", "action": "set_token_horizon",
                     "params": {"horizon_steps": INSIDE_WARMUP}}]
        return []

    res = train(CFG, run_id="ext", ckpt_dir=tmp_path_factory.mktemp("ext"), sink=rec, peak_flops=PEAK,
                steps=6, extend=EXTEND, decisions=decisions)
    return res, rec


def test_mfu_counts_the_flops_per_token_of_the_length_trained(extended):
    _, rec = extended
    steps = rec.payloads("step")
    assert [s for s, _ in steps] == list(range(1, 7))
    long_cfg = dataclasses.replace(CFG, model=dataclasses.replace(CFG.model, seq_len=EXTEND[1]))
    for k, p in steps:
        L = EXTEND[1] if k >= EXTEND[0] else CFG.model.seq_len
        want = flops_per_token(long_cfg if k >= EXTEND[0] else CFG)
        assert p["seq_len"] == L
        assert p["flops_per_token"] == pytest.approx(want, rel=1e-12)
        assert p["mfu"] * p["step_time_s"] * PEAK / p["tokens"] == pytest.approx(want, rel=1e-9)  # the audit's recompute
    assert flops_per_token(long_cfg) > 1.1 * flops_per_token(CFG)  # the attention term is not negligible here


def test_a_horizon_inside_warmup_is_refused_and_the_schedule_kept(extended):
    res, rec = extended
    [(at, applied)] = rec.payloads("decision_applied")
    assert at == 1 and applied["decision_id"] == "d-warmup" and applied["status"] == "refused"
    assert "inside warmup" in applied["reason"]
    assert res.final_step == 6  # the run went on under its own schedule
    lrs = [p["lr"] for _, p in rec.payloads("step")]
    assert lrs[:5] == sorted(lrs[:5])  # still climbing through warmup: no fall to the floor
