"""Small ledgers for the audit tests, written by the real writer: a healthy run, and the same run
with one fault planted (`fault=`), so each health check can be shown to fire exactly there.

A run has 400 steps one second apart (so blocks are 4 steps and trailing windows 20), a drops
event per step, an eval every 20 steps, a checkpoint every 100, and run_started / data /
run_finished around them; its lr follows training/schedule.py.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.emit.sink import ParquetSink
from runledger.ledger.storage.rows import StoredEvent
from runledger.ledger.storage.store import write_events
from runledger.training.decisions import apply_decision
from runledger.training.schedule import lr_at, make_schedule, retime

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
STEPS = 400
TOKENS_PER_STEP = 1024
N_EXPERTS = 8
PLANNED_TOKENS_PER_S = 1000.0
CONFIG = {"moe": {"n_experts": N_EXPERTS}, "steps": STEPS, "data": {"mixture": [["code", 0.5], ["prose", 0.5]]}}
CONFIG_HASH = hashlib.sha256(canonical_json(CONFIG).encode()).hexdigest()


def clean_loss(k: int) -> float:
    return 2.0 + 8.0 / math.sqrt(k)


class Ledger:
    """Parquet sinks (runledger.ledger.emit.sink), one per chain (run, producer, attempt), sharing one stream order and
    one list of sealed rows (`rows`, which a test may edit before `write()`)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.rows: list[StoredEvent] = []
        self.sinks: dict[tuple, ParquetSink] = {}
        self.stream_seqs = itertools.count(1)

    def sink(self, run_id: str, producer: str = "worker-0", attempt: int = 0) -> ParquetSink:
        key = (run_id, producer, attempt)
        if key not in self.sinks:
            self.sinks[key] = ParquetSink(self.root, run_id, producer, attempt, stream_seqs=self.stream_seqs,
                                          rows=self.rows, flush_every=None)
        return self.sinks[key]

    def emit(self, run_id: str, kind: str, payload: dict, step: int | None, at: datetime,
             producer: str = "worker-0", attempt: int = 0) -> str:
        return self.sink(run_id, producer, attempt).emit_dict(kind, payload, step, time=at)

    def write(self) -> None:
        write_events(self.root, self.rows)
        self.rows.clear()


def write_run(led: Ledger, run_id: str, fault: str | None = None, *, ladder: str | None = None,
              drop_fraction: float = 0.01, forecasts: str | None = None, with_start: bool = True,
              retime_at: int | None = 200, new_horizon: int = 300, thresholds: dict | None = None,
              attempt: int = 0, first: int = 1, last: int = STEPS, finish: bool = True, t_offset: float = 0.0,
              schedule: dict | None = None, resumed_from: dict | None = None, code_commit: str = "abc123",
              parent: dict | None = None, decision_style: str = "worker") -> None:
    """One run (or one attempt of it: steps first..last); `fault` plants one problem (see the cases below)."""
    rng = np.random.default_rng(zlib.crc32(f"{run_id}:{attempt}".encode()))
    schedule = schedule or make_schedule(1e-3, 20, STEPS, 0.05, tokens_per_step=TOKENS_PER_STEP)
    start = {
        "config": CONFIG, "config_hash": CONFIG_HASH if fault != "config_hash" else "0" * 64,
        "code_commit": code_commit, "resumed_from": resumed_from, "parent": parent,
        "token_budget": STEPS * TOKENS_PER_STEP, "tokens_per_step": TOKENS_PER_STEP,
        "schedule": schedule, "data_mixture": {"code": 0.5, "prose": 0.5},
        "planned_tokens_per_s": PLANNED_TOKENS_PER_S,
    }
    if thresholds:
        start["thresholds"] = thresholds
    if ladder:
        start["ladder"] = {"name": ladder}
    t_start = T0 + timedelta(seconds=t_offset)
    at = t_start + timedelta(seconds=first - 1)

    def emit(kind, payload, step, at, producer="worker-0"):
        led.emit(run_id, kind, payload, step, at, producer=producer, attempt=attempt if producer == "worker-0" else 0)

    if with_start:
        emit("run_started", start, first - 1, at)
        emit("data", {
            "sources": [{"domain": "code", "path": "code.txt", "sha256": "a" * 64, "byte_start": 0, "byte_end": 100},
                        {"domain": "prose", "path": "prose.txt", "sha256": "b" * 64, "byte_start": 0, "byte_end": 90}],
            "tokens_per_domain": {"code": 200 * TOKENS_PER_STEP, "prose": 200 * TOKENS_PER_STEP},
            "mixture": {"code": 0.5, "prose": 0.5}, "seed": 0}, first - 1, at)
    applied_lr_schedule = schedule
    for k in range(first, last + 1):
        at = t_start + timedelta(seconds=k)
        if fault == "silence" and k > 250:
            at += timedelta(minutes=11)
        if retime_at is not None and k == retime_at + 1 and with_start:
            # an agent shortens the horizon after update `retime_at`; the worker carries it out before
            # update k, as training/decisions.py does (or, `horizon_only`, says only the new horizon in `after`)
            decision = {"decision_id": f"{run_id}-d1", "agent": "agent-horizon", "rule": "contingency",
                        "action": "set_token_horizon", "params": {"horizon_steps": new_horizon},
                        "rationale": "loss above forecast", "evidence": {"query": "forecast/vs_actual"}}
            emit("decision", decision, retime_at, at, producer="agent-horizon")
            if decision_style == "horizon_only":
                new = retime(schedule, k, new_horizon)
                applied = {"decision_id": decision["decision_id"], "action": "set_token_horizon",
                           "before": {"horizon_steps": STEPS}, "after": {"horizon_steps": new_horizon}}
            else:
                _, new, applied, _ = apply_decision(decision, k, None, schedule)
            if fault != "lr_decision_ignored":
                applied_lr_schedule = new
            emit("decision_applied", applied, retime_at, at)
        loss = clean_loss(k) + float(rng.normal(0, 0.01))
        grad = 0.3 + 0.02 * float(rng.random())
        lr = lr_at(k, **applied_lr_schedule)
        param_norm = 100.0 + 0.01 * k
        entropy = 0.97 * math.log(N_EXPERTS)
        mfu = 0.40 + 0.002 * float(rng.random())
        tps = 1050.0 + float(rng.random())
        skipped = False
        if fault == "grad_norm_spike" and k == 250:
            grad = 3.0
        if fault == "grad_norm_rise" and k > 300:
            grad = 0.3 * (1 + (k - 300) / 20)
        if fault == "loss_floor" and k > 300:
            loss += 2.0
        if fault == "loss_rise" and k > 300:
            loss += 0.005 * (k - 300)
        if fault == "router_entropy" and k > 200:
            entropy = 0.5 * math.log(N_EXPERTS)
        if fault == "param_norm" and k > 300:
            param_norm *= 1 + 0.02 * (k - 300)
        if fault == "throughput" and 200 < k <= 240:
            tps = 800.0
        if fault == "mfu_dip" and 200 < k <= 240:
            mfu = 0.25
        if fault == "lr_off" and k == 250:
            lr *= 1.1
        if fault == "skipped" and k in (100, 300, 305, 310):
            skipped = True
        step = {"loss": None if skipped else loss, "grad_norm": grad, "lr": lr, "tokens": TOKENS_PER_STEP,
                "step_time_s": 1.0, "param_norm": param_norm, "router_entropy": entropy, "mfu": mfu,
                "tokens_per_s": tps, "skipped": skipped}
        emit("step", step, k, at)
        frac = drop_fraction
        if fault == "drop_fraction" and k == 200:
            frac = 0.10
        if fault == "drops_vs_ladder" and k >= 200:
            frac = 0.05
        emit("drops", {"dispatch": "capacity", "assignments": 10_000, "dropped": int(frac * 10_000),
                       "drop_fraction": frac}, k, at)
        if k % 20 == 0:
            eval_loss = clean_loss(k) + 0.1
            if fault == "eval_worse" and k == 300:
                eval_loss *= 1.05
            emit("eval", {"loss": eval_loss, "domain_losses": {"code": eval_loss, "prose": eval_loss}}, k, at)
        if k % 100 == 0 and with_start:
            chash = "f" * 64 if (fault == "checkpoint_config" and k == 300) else CONFIG_HASH
            emit("checkpoint", {"path": f"ckpt/{run_id}/{k}", "bytes": 10, "seconds": 0.1,
                                "content_hash": f"{k:064x}", "config_hash": chash,
                                "tokens_seen": k * TOKENS_PER_STEP}, k, at)
    if forecasts:
        for i in range(1, 20):
            g = i / 20
            s = round(g * STEPS)
            projected = float(np.mean([clean_loss(j) for j in range(s - 3, s + 1)]))
            if forecasts == "miss" and i == 10:
                projected -= 0.5
            led.emit("ladder-fit", "forecast", {"target_run": run_id, "fraction": g, "projected_loss": projected,
                                                "band_low": projected - 0.1, "band_high": projected + 0.1,
                                                "rungs": ["rung-a"]}, None, at, producer="ladder")
    if finish:
        emit("run_finished", {"status": "completed", "final_step": last}, last, at + timedelta(seconds=1))
