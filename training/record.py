"""What the worker records: its typed events, built on the host from a step's metrics.

Plain Python numbers only (the event models are strict): a jax or numpy scalar becomes float or
int here, and a non-finite value becomes None (a skipped step has loss None and skipped True).
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import jax

from runledger.ledger.contract.events import LayerDrops, StepCompleted, TokensDropped
from runledger.ledger.settings import child_env
from runledger.training.config import TrainConfig


def code_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, env=child_env())  # (no server URL or creds)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def hardware(mesh) -> dict:
    dev = jax.devices()[0]
    return {"platform": dev.platform, "device_kind": dev.device_kind, "device_count": jax.device_count(),
            "cpu_count": os.cpu_count() or 0, "jax": jax.__version__,
            "expert_parallel_devices": int(mesh.devices.size) if mesh is not None else 0}


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def step_completed(m: dict, tokens: int, seq_len: int, dt: float, fpt: float, peak: float) -> StepCompleted:
    """The `step` event: `fpt` is the FLOPs per token at `seq_len`, the length this step trained at."""
    skipped = bool(m["skipped"])
    return StepCompleted(
        loss=None if skipped else _num(m["loss"]), grad_norm=_num(m["grad_norm"]), lr=float(m["lr"]),
        tokens=tokens, step_time_s=dt, param_norm=_num(m["param_norm"]), z_loss=_num(m["z_loss"]),
        lb_loss=_num(m["lb_loss"]), router_entropy=_num(m["router_entropy"]),
        mfu=fpt * tokens / dt / peak if peak else None, tokens_per_s=tokens / dt, seq_len=seq_len,
        flops_per_token=fpt, skipped=skipped,
    )


def tokens_dropped(layers: dict, cfg: TrainConfig, seq_len: int, probe: bool = False) -> TokensDropped:
    """The `drops` event of one step (or of a probe at a longer length than trained)."""
    rows = []
    for i in range(len(layers["assignments"])):
        a, s, r = (int(layers[k][i]) for k in ("assignments", "sender_dropped", "receiver_dropped"))
        rows.append(LayerDrops(layer=i, assignments=a, sender_dropped=s, receiver_dropped=r,
                               drop_fraction=(s + r) / a if a else 0.0,
                               expert_loads=[int(v) for v in layers["loads"][i]]))
    total = sum(r.assignments for r in rows)
    dropped = sum(r.sender_dropped + r.receiver_dropped for r in rows)
    capacity = cfg.moe.dispatch == "capacity"
    return TokensDropped(dispatch=cfg.moe.dispatch, assignments=total, dropped=dropped,
                         drop_fraction=dropped / total if total else 0.0, layers=rows,
                         cf_send=float(cfg.moe.cf_send) if capacity else None,
                         cf_recv=float(cfg.moe.cf_recv) if capacity else None, seq_len=seq_len,
                         **({"probe": True} if probe else {}))
