"""Training fidelity: after a context extension each step's MFU counts the FLOPs per token of the
length it trained at (and the step says which), the throughput audit holds a healthy run to its
planned FLOP rate rather than its tokens/s, and a retimed horizon inside warmup is refused."""

from __future__ import annotations

from datetime import timedelta

from runledger.queries import audit  # noqa: E402
from support.audit_ledger import T0, Ledger  # noqa: E402


def _run_with_extension(led: Ledger, run_id: str, slow_after: int | None) -> None:
    """400 steps at 1 s; from step 200 the length grows 4x: FLOPs per token x1.85, tokens/s / 1.85, MFU held.

    `slow_after`: from that step a slow node halves the FLOP rate (a real miss, for the audit to catch)."""
    peak, fpt0, mfu_plan = 1e12, 6.5e6, 0.3
    planned_tps = mfu_plan * peak / fpt0
    led.emit(run_id, "run_started", {
        "config": {"moe": {"n_experts": 8}, "steps": 400, "planned_mfu": mfu_plan}, "config_hash": "0" * 64,
        "token_budget": 400 * 1024, "tokens_per_step": 1024, "schedule": {}, "planned_tokens_per_s": planned_tps,
        "peak_flops": peak, "flops_per_token": fpt0}, 0, T0)
    for k in range(1, 401):
        fpt = fpt0 * (1.85 if k >= 200 else 1.0)
        mfu = mfu_plan * (0.5 if slow_after is not None and k >= slow_after else 1.0)
        tps = mfu * peak / fpt
        led.emit(run_id, "step", {"loss": 2.0, "grad_norm": 0.3, "lr": 1e-3, "tokens": 1024,
                                  "step_time_s": 1024 / tps, "mfu": mfu, "tokens_per_s": tps,
                                  "seq_len": 512 if k >= 200 else 128, "flops_per_token": fpt}, k,
                 T0 + timedelta(seconds=k))


def test_throughput_audit_holds_an_extended_run_to_its_flop_rate(tmp_path):
    led = Ledger(tmp_path / "ledger")
    _run_with_extension(led, "healthy", slow_after=None)
    _run_with_extension(led, "slow", slow_after=300)
    led.write()
    rows = {r["run_id"]: r for r in audit.run_suite(led.root, "health").rows() if r["check"] == "mfu_below_plan"}
    assert rows["healthy"]["status"] == "ok", rows["healthy"]
    assert rows["slow"]["status"] == "fail" and rows["slow"]["at_step"] > 250, rows["slow"]
