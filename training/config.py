"""Training configs: small frozen dataclasses, the named presets, and the config hash.

A config only describes a run; `runledger.training.model`, `runledger.training.moe`, `runledger.training.data` and
`runledger.training.worker` build things from it. Presets are plain named configs: `tiny` (tests, seconds),
`small` (the demo's main run, a few minutes on 2 CPU cores) and the ladder rungs `rung0..rung3`
(about 3-4x more compute per rung).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

from runledger.ledger.contract.canonical import canonical_json


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256  # byte-level tokens
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 64
    rope_base: float = 10000.0


@dataclass(frozen=True)
class MoEConfig:
    n_experts: int = 8
    top_k: int = 2
    n_shared: int = 1  # shared experts: every token, always on
    d_ff_shared: int = 128
    d_latent: int = 32  # routed path is compressed to this before dispatch (Marin: 6144 -> 3072)
    d_ff_expert: int = 64
    dispatch: str = "capacity"  # "capacity" | "dropless"; switchable between steps
    shards: int = 2  # S expert shards (= devices when expert-parallel; simulated on 1 device)
    waves: int = 3  # W, Marin's pooled-wave transport
    cf_send: float = 1.10  # Marin defaults
    cf_recv: float = 1.15
    wave_order: str = "in_order"  # "in_order" (Marin's: rank // pool) | "round_robin" (rank % W); see runledger.training.moe
    lb_coef: float | None = 0.01  # load-balancing loss E * sum f_e * p_e
    router_z_coef: float | None = 1e-3  # mean(logsumexp(router logits)^2)

    def __post_init__(self) -> None:
        if self.dispatch not in ("capacity", "dropless"):
            raise ValueError(f"dispatch must be 'capacity' or 'dropless', not {self.dispatch!r}")
        if self.wave_order not in ("in_order", "round_robin"):
            raise ValueError(f"wave_order must be 'in_order' or 'round_robin', not {self.wave_order!r}")
        if self.n_experts % self.shards:
            raise ValueError(f"n_experts {self.n_experts} must divide into {self.shards} shards")


@dataclass(frozen=True)
class OptimConfig:
    peak_lr: float = 3e-3
    warmup_steps: int = 5
    min_lr_ratio: float = 0.05  # decay ends at 5% of peak (Marin's contingency anchor)
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float = 1.0


@dataclass(frozen=True)
class DataConfig:
    mixture: tuple[tuple[str, float], ...] = (("code", 0.5), ("prose", 0.3), ("math", 0.2))
    heldout_fraction: float = 0.05
    code_bytes: int = 2_000_000  # how much of the stdlib sources to read (sorted file order)

    def mixture_dict(self) -> dict[str, float]:
        return dict(self.mixture)


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    batch_size: int = 8  # sequences per step
    steps: int = 20  # the planned horizon, in steps
    seed: int = 0
    logit_z_coef: float | None = 1e-4  # LM-head logit z-loss (Marin anchor); None turns it off
    eval_every: int = 10
    eval_batches: int = 1  # per domain
    ckpt_every: int = 10
    log_every: int = 10
    planned_mfu: float = 0.10  # planned tokens/s = planned_mfu * measured peak / flops_per_token
    health: str = "default"  # the health profile the audits and agents hold the run to (queries/thresholds.py)
    # the logged loss is the mean cross-entropy over every next byte of the batch (the tokens are bytes): nats
    # per byte. No bytes_per_token: there is no subword tokenizer whose per-token numbers (Marin's) it could meet.
    loss_unit: str = "byte"

    def __post_init__(self) -> None:
        from runledger.queries.thresholds import check_loss_unit, check_profile

        check_profile(self.health)
        check_loss_unit(self.loss_unit)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.seq_len

    @property
    def token_budget(self) -> int:
        return self.tokens_per_step * self.steps

    def to_dict(self) -> dict:
        """Plain JSON-able dict (tuples become lists) for the `run_started` event."""
        return _jsonable(dataclasses.asdict(self))


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def from_dict(d: dict) -> TrainConfig:
    """Inverse of `TrainConfig.to_dict` (for a resumed or forked run)."""
    data = dict(d["data"])
    data["mixture"] = tuple((str(k), float(v)) for k, v in data["mixture"])
    return TrainConfig(
        model=ModelConfig(**d["model"]), moe=MoEConfig(**d["moe"]), optim=OptimConfig(**d["optim"]),
        data=DataConfig(**data), **{k: v for k, v in d.items() if k not in ("model", "moe", "optim", "data")},
    )


def config_hash(cfg: TrainConfig) -> str:
    """sha256 of the config's canonical JSON (RFC 8785, the same form the ledger hashes)."""
    return hashlib.sha256(canonical_json(cfg.to_dict()).encode()).hexdigest()


def _rung(d_model: int, n_layers: int, steps: int, d_ff: int) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig(d_model=d_model, n_layers=n_layers, n_heads=4, seq_len=64),
        moe=MoEConfig(d_ff_shared=2 * d_ff, d_latent=d_model // 2, d_ff_expert=d_ff),
        batch_size=8, steps=steps, eval_every=max(steps // 4, 1), ckpt_every=steps, log_every=max(steps // 5, 1),
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=max(steps // 20, 1)),
    )


PRESETS: dict[str, TrainConfig] = {
    "tiny": TrainConfig(),
    "small": TrainConfig(
        model=ModelConfig(d_model=128, n_layers=4, n_heads=4, seq_len=128),
        moe=MoEConfig(d_ff_shared=256, d_latent=64, d_ff_expert=128),
        batch_size=8, steps=300, eval_every=50, eval_batches=2, ckpt_every=100, log_every=25,
        optim=OptimConfig(peak_lr=3e-3, warmup_steps=20),
    ),
    # the ladder: compute grows ~3-4x per rung (flops_per_token x tokens; see runledger.training.flops)
    "rung0": _rung(d_model=32, n_layers=2, steps=60, d_ff=32),
    "rung1": _rung(d_model=48, n_layers=2, steps=120, d_ff=48),
    "rung2": _rung(d_model=64, n_layers=3, steps=200, d_ff=64),
    "rung3": _rung(d_model=96, n_layers=3, steps=360, d_ff=96),
}


def preset(name: str) -> TrainConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r} (presets: {', '.join(PRESETS)})") from None
