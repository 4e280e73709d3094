"""Model FLOPs per token (counted: active parameters only, attention included) and the measured
matmul peak of this machine, the two numbers MFU is made of.

Per token, forward = 2 * active matmul params + attention scores and mixing (2 * 2 * L * d per
layer, causal average L/2 counted as the full L, Kaplan et al. 2020); training = 3 * forward.
Active params: attention q,k,v,o; router; shared experts; latent down/up; top_k routed experts;
the LM head. Embedding lookups are not matmuls and are not counted.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from runledger.training.config import TrainConfig


def active_params(cfg: TrainConfig) -> int:
    m, e = cfg.model, cfg.moe
    d = m.d_model
    per_layer = (
        4 * d * d  # attention q, k, v, o
        + d * e.n_experts  # router
        + e.n_shared * 3 * d * e.d_ff_shared  # shared SwiGLU experts
        + 2 * d * e.d_latent  # latent compression and expansion
        + e.top_k * 3 * e.d_latent * e.d_ff_expert  # the routed experts a token actually uses
    )
    return m.n_layers * per_layer + d * m.vocab_size


def flops_per_token(cfg: TrainConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token (forward + backward = 3x forward)."""
    L = seq_len or cfg.model.seq_len
    attn = cfg.model.n_layers * 2 * 2 * L * cfg.model.d_model
    return float(3 * (2 * active_params(cfg) + attn))


def measure_peak_flops(n: int = 1024, seconds: float = 1.0) -> float:
    """Sustained float32 matmul FLOP/s of the default device, measured for about `seconds`."""
    reps = 8

    @jax.jit
    def chain(a, b):
        def body(_, x):
            return (x @ b) * (1.0 / n)
        return jax.lax.fori_loop(0, reps, body, a)

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    chain(a, b).block_until_ready()  # compile and warm up
    calls, start = 0, time.perf_counter()
    while True:
        chain(a, b).block_until_ready()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return 2.0 * n**3 * reps * calls / elapsed
