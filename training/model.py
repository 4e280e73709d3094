"""The whole model: a decoder-only byte transformer whose every block is attention + an MoE branch.

`init_params(key, cfg)` builds the parameters; `forward(params, tokens, cfg)` returns the logits and
the per-layer MoE extras stacked over layers; `loss_fn` adds the auxiliary terms (LB loss, router
z-loss, LM-head logit z-loss; each coefficient in the config, None turns it off).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from runledger.training.config import TrainConfig
from runledger.training.moe import init_moe, moe_layer


def init_params(seed: int, cfg: TrainConfig) -> dict:
    """Parameters as a pure function of the seed (numpy's generator: fast on CPU, no compile)."""
    m = cfg.model
    d = m.d_model
    rng = np.random.default_rng(seed)

    def normal(shape, scale):
        return jnp.asarray(rng.standard_normal(shape, np.float32) * np.float32(scale))

    blocks = []
    for _ in range(m.n_layers):
        blocks.append({
            "ln1": jnp.ones((d,)), "ln2": jnp.ones((d,)),
            "wq": normal((d, d), d**-0.5), "wk": normal((d, d), d**-0.5), "wv": normal((d, d), d**-0.5),
            "wo": normal((d, d), (d * 2 * m.n_layers) ** -0.5),
            "moe": init_moe(rng, d, cfg.moe),
        })
    return {
        "embed": normal((m.vocab_size, d), 0.02),
        "blocks": blocks,
        "ln_f": jnp.ones((d,)),
        "head": normal((d, m.vocab_size), d**-0.5),
    }


def rms_norm(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def rope(x: jax.Array, base: float) -> jax.Array:
    """Rotary position embedding on [B, L, H, Dh] (any sequence length)."""
    L, dh = x.shape[1], x.shape[-1]
    freqs = base ** (-jnp.arange(0, dh, 2) / dh)
    ang = jnp.arange(L)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


def attention(blk: dict, x: jax.Array, cfg: TrainConfig) -> jax.Array:
    B, L, d = x.shape
    H = cfg.model.n_heads
    q, k, v = ((x @ blk[w]).reshape(B, L, H, d // H) for w in ("wq", "wk", "wv"))
    q, k = rope(q, cfg.model.rope_base), rope(k, cfg.model.rope_base)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // H)
    causal = jnp.tril(jnp.ones((L, L), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, L, d) @ blk["wo"]


def forward(params: dict, tokens: jax.Array, cfg: TrainConfig, mesh=None) -> tuple[jax.Array, dict]:
    """tokens [B, L] -> (logits [B, L, V], extras: each MoE statistic stacked over layers)."""
    B, L = tokens.shape
    x = params["embed"][tokens]
    per_layer = []
    for blk in params["blocks"]:
        x = x + attention(blk, rms_norm(x, blk["ln1"]), cfg)
        y, extras = moe_layer(blk["moe"], rms_norm(x, blk["ln2"]).reshape(B * L, -1), cfg.moe, mesh)
        x = x + y.reshape(B, L, -1)
        per_layer.append(extras)
    logits = rms_norm(x, params["ln_f"]) @ params["head"]
    return logits, jax.tree.map(lambda *a: jnp.stack(a), *per_layer)


def loss_fn(params: dict, batch: dict, cfg: TrainConfig, mesh=None) -> tuple[jax.Array, dict]:
    """Next-byte cross-entropy + auxiliary terms; returns (total, metrics incl. per-layer extras)."""
    logits, extras = forward(params, batch["inputs"], cfg, mesh)
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.mean(jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1))
    lb, rz = jnp.mean(extras["lb_loss"]), jnp.mean(extras["z_loss"])
    logit_z = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    total = ce
    if cfg.moe.lb_coef is not None:
        total = total + cfg.moe.lb_coef * lb
    if cfg.moe.router_z_coef is not None:
        total = total + cfg.moe.router_z_coef * rz
    if cfg.logit_z_coef is not None:
        total = total + cfg.logit_z_coef * logit_z
    return total, {"ce": ce, "lb_loss": lb, "z_loss": rz, "logit_z": logit_z, "layers": extras}


def token_losses(params: dict, tokens: jax.Array, targets: jax.Array, cfg: TrainConfig, mesh=None) -> jax.Array:
    """Per-sequence mean cross-entropy [B] (for held-out evaluation per domain)."""
    logits, _ = forward(params, tokens, cfg, mesh)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0], axis=-1)
