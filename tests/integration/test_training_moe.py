"""The MoE branch: capacity accounting against a plain numpy reference, dispatch against a dense
per-token reference, and drops counted per layer in the model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runledger.training import moe
from runledger.training.config import MoEConfig, TrainConfig
from runledger.training.model import attention, forward, init_params, rms_norm
from support.moe import random_routing, reference_accounting

capacity_dispatch = jax.jit(moe.dispatch_capacity, static_argnames=("cfg",))
moe_layer = jax.jit(moe.moe_layer, static_argnames=("cfg",))


def dense_reference(x_lat, top_e, gates, experts, kept=None):
    w1, w3, w2 = (np.asarray(experts[w], np.float64) for w in ("w1", "w3", "w2"))
    x = np.asarray(x_lat, np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(top_e.shape[1]):
            if kept is not None and not kept[t, j]:
                continue
            e = top_e[t, j]
            h1, h3 = x[t] @ w1[e], x[t] @ w3[e]
            out[t] += gates[t, j] * ((h1 / (1 + np.exp(-h1))) * h3) @ w2[e]
    return out


def _experts(key, E, d, f):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"w1": jax.random.normal(k1, (E, d, f)) / math.sqrt(d), "w3": jax.random.normal(k2, (E, d, f)) / math.sqrt(d),
            "w2": jax.random.normal(k3, (E, f, d)) / math.sqrt(f)}


@pytest.mark.parametrize("S,W,cf_send,cf_recv,skew,order", [
    (2, 3, 1.10, 1.15, 0.5, "in_order"), (4, 3, 1.10, 1.15, 1.0, "in_order"), (4, 2, 1.0, 1.0, 0.3, "in_order"),
    (1, 3, 1.10, 1.15, 0.5, "in_order"), (2, 1, 1.25, 1.0, 2.0, "in_order"), (4, 3, 1.10, 1.15, 1.0, "round_robin"),
    (2, 3, 1.0, 1.0, 0.3, "round_robin"),
])
def test_capacity_accounting_and_output_match_the_numpy_reference(S, W, cf_send, cf_recv, skew, order):
    rng = np.random.default_rng(S * 100 + W)
    T, E, k, d = 96, 8, 2, 8
    cfg = MoEConfig(n_experts=E, top_k=k, shards=S, waves=W, cf_send=cf_send, cf_recv=cf_recv, wave_order=order)
    experts = _experts(jax.random.key(S), E, d, 16)
    for _ in range(3):  # several random routings
        top_e = random_routing(rng, T, E, k, skew)
        gates = rng.dirichlet(np.ones(k), size=T).astype(np.float32)
        x_lat = rng.normal(size=(T, d)).astype(np.float32)
        kept, s_ref, r_ref = reference_accounting(top_e, E, S, W, cf_send, cf_recv, order)
        out, s_drop, r_drop = capacity_dispatch(jnp.asarray(x_lat), jnp.asarray(top_e), jnp.asarray(gates), experts, cfg=cfg)
        assert (int(s_drop), int(r_drop)) == (s_ref, r_ref)
        assert s_ref + r_ref == (~kept).sum()
        np.testing.assert_allclose(np.asarray(out), dense_reference(x_lat, top_e, gates, experts, kept), atol=2e-4)


def test_dropless_equals_the_dense_per_token_reference():
    rng = np.random.default_rng(1)
    T, E, k, d = 64, 8, 2, 8
    experts = _experts(jax.random.key(0), E, d, 16)
    top_e = random_routing(rng, T, E, k, 0.3)
    gates = rng.dirichlet(np.ones(k), size=T).astype(np.float32)
    x_lat = rng.normal(size=(T, d)).astype(np.float32)
    out = jax.jit(moe.dispatch_dropless)(jnp.asarray(x_lat), jnp.asarray(top_e), jnp.asarray(gates), experts)
    np.testing.assert_allclose(np.asarray(out), dense_reference(x_lat, top_e, gates, experts), atol=2e-4)


def test_capacity_with_room_for_everything_equals_dropless():
    x = jax.random.normal(jax.random.key(1), (64, 32))
    roomy = MoEConfig(shards=2, cf_send=4.0, cf_recv=8.0)
    params = moe.init_moe(np.random.default_rng(0), 32, roomy)
    out_c, ex_c = moe_layer(params, x, cfg=roomy)
    out_d, _ = moe_layer(params, x, cfg=MoEConfig(shards=2, dispatch="dropless"))
    assert int(ex_c["sender_dropped"]) == int(ex_c["receiver_dropped"]) == 0
    np.testing.assert_allclose(np.asarray(out_c), np.asarray(out_d), atol=1e-5)


def test_router_statistics():
    logits = jnp.asarray(np.random.default_rng(2).normal(size=(32, 4)), jnp.float32)
    probs = jax.nn.softmax(logits)
    top_e = jnp.asarray(np.stack([np.arange(32) % 4, (np.arange(32) + 1) % 4], 1), jnp.int32)
    st = moe.router_stats(logits, probs, top_e, 4)
    assert st["loads"].tolist() == [16, 16, 16, 16]
    assert float(st["entropy"]) == pytest.approx(math.log(4), rel=1e-6)  # uniform load: max entropy
    assert float(st["lb_loss"]) == pytest.approx(1.0, rel=1e-5)  # E * sum (1/E) p_mean = 1
    lse = np.log(np.exp(np.asarray(logits, np.float64)).sum(1))
    assert float(st["z_loss"]) == pytest.approx(float(np.mean(lse**2)), rel=1e-5)


def test_drops_are_counted_per_layer_in_the_model():
    cfg = TrainConfig()
    params = init_params(0, cfg)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 256, (cfg.batch_size, cfg.model.seq_len)), jnp.int32)
    _, extras = jax.jit(forward, static_argnums=2)(params, tokens, cfg)
    m = cfg.moe
    B, L = tokens.shape

    @jax.jit
    def layer(blk, x):  # one block by hand: its routing, and its output
        x = x + attention(blk, rms_norm(x, blk["ln1"]), cfg)
        h = rms_norm(x, blk["ln2"]).reshape(B * L, -1)
        _, _, top_e, _ = moe.route(h, blk["moe"]["router"], m.top_k)
        return x + moe.moe_layer(blk["moe"], h, m)[0].reshape(B, L, -1), top_e

    x = params["embed"][tokens]
    for i, blk in enumerate(params["blocks"]):  # each layer's routing, checked against numpy
        x, top_e = layer(blk, x)
        _, s_ref, r_ref = reference_accounting(np.asarray(top_e), m.n_experts, m.shards, m.waves, m.cf_send, m.cf_recv)
        assert int(extras["sender_dropped"][i]) == s_ref
        assert int(extras["receiver_dropped"][i]) == r_ref
        assert np.asarray(extras["loads"][i]).tolist() == np.bincount(np.asarray(top_e).ravel(), minlength=m.n_experts).tolist()
