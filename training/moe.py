"""The MoE branch of a block: router, shared experts, and routed experts behind a latent projection.

Read as named steps (gate -> route -> compress -> dispatch -> experts -> combine -> expand), it
returns `(out, extras)`: the output and its accounting (sender/receiver drops, expert loads, routing
entropy, load-balancing and router z-losses).

Two dispatch modes:
- `capacity`: fixed shapes, Marin's pooled-wave transport across S expert shards and W waves.
  Each shard holds n local tokens, so A = n * k assignments. Assignments are ranked slot-major
  (every token's first choice before any second choice), then by token. A sender keeps, per
  destination shard, the first W * pool of them, pool = ceil(cf_send * A / (S * W)); the rank
  decides the wave. A receiver keeps, per local expert and wave, the first
  capacity = ceil(cf_recv * A / (E_local * W)) arrivals, ordered by sender then by sender rank.
  The rest are sender drops and receiver drops, counted separately. Capacities are computed in
  exact arithmetic (`capacities`): a factor is the decimal it was written as.

  Wave filling (`MoEConfig.wave_order`). The model uses `in_order`, Marin's pooled-wave transport
  as DESIGN.md anchors it: wave = rank // pool, so every wave but the last is packed full to
  cf_send's pool and sent as soon as it is full. A packed wave carries cf_send times its share
  of a destination's assignments, so the receiver's headroom in it is cf_recv / cf_send
  (1.15 / 1.10), not cf_recv. `round_robin` (wave = rank % W) spreads each destination's ranks
  evenly over the waves, giving each wave the full cf_recv headroom at the same sender drops;
  it needs a destination's whole list ranked before the first wave leaves, where in-order can
  send a wave once its pool is full. The model keeps in-order because it is the transport whose
  drop counts the anchors (and the audits' thresholds) describe; round-robin is the option that
  lowers receiver drops (`bench/drops.py`, over 60 updates of `small`: 0.80x the mean drop
  fraction at the trained length, 0.90x at 8x the length). The same per-shard code runs
  truly expert-parallel (`shard_map` + `all_to_all` over N devices) or simulated on one device
  (`vmap` over the same named axis), so both give the same losses and drop counts.
- `dropless`: every assignment kept (sort by expert, `jax.lax.ragged_dot`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from runledger.training.config import MoEConfig

AXIS = "ep"  # the expert-parallel mesh axis


def init_moe(rng: np.random.Generator, d_model: int, cfg: MoEConfig) -> dict:
    """Parameters from a numpy generator (fast on CPU, and a pure function of the seed)."""
    E, f, fs, dl, ns = cfg.n_experts, cfg.d_ff_expert, cfg.d_ff_shared, cfg.d_latent, cfg.n_shared

    def dense(shape, fan_in):
        return jnp.asarray(rng.standard_normal(shape, np.float32) / np.float32(math.sqrt(fan_in)))

    return {
        "router": dense((d_model, E), d_model),
        "shared": {"w1": dense((ns, d_model, fs), d_model), "w3": dense((ns, d_model, fs), d_model),
                   "w2": dense((ns, fs, d_model), fs)},
        "down": dense((d_model, dl), d_model),
        "up": dense((dl, d_model), dl),
        "experts": {"w1": dense((E, dl, f), dl), "w3": dense((E, dl, f), dl), "w2": dense((E, f, dl), f)},
    }


def expert_ffn(x: jax.Array, w1: jax.Array, w3: jax.Array, w2: jax.Array) -> jax.Array:
    """SwiGLU experts applied batch-wise: x [E, C, d] with per-expert weights [E, ...]."""
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", x, w1)) * jnp.einsum("ecd,edf->ecf", x, w3)
    return jnp.einsum("ecf,efd->ecd", h, w2)


def route(x: jax.Array, w_router: jax.Array, k: int):
    """Softmax top-k: (logits [T,E], probs [T,E], expert ids [T,k], normalised gates [T,k])."""
    logits = x @ w_router
    probs = jax.nn.softmax(logits, axis=-1)
    top_p, top_e = jax.lax.top_k(probs, k)
    gates = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    return logits, probs, top_e, gates


def router_stats(logits: jax.Array, probs: jax.Array, top_e: jax.Array, n_experts: int) -> dict:
    """Expert loads, routing entropy of the aggregate load, LB loss E*sum f*p, router z-loss."""
    loads = jnp.sum(jax.nn.one_hot(top_e, n_experts, dtype=jnp.int32), axis=(0, 1))
    f = loads / top_e.size
    entropy = -jnp.sum(jnp.where(f > 0, f * jnp.log(jnp.where(f > 0, f, 1.0)), 0.0))
    lb = n_experts * jnp.sum(jax.lax.stop_gradient(f) * jnp.mean(probs, axis=0))
    z = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    return {"loads": loads, "entropy": entropy, "lb_loss": lb, "z_loss": z}


def exact_factor(cf: float) -> Fraction:
    """A capacity factor as the decimal it was written as: 1.1 is 11/10, not the double 1.1000000000000000888.

    `repr` of a float is the shortest decimal that reads back as the same double, so a factor written
    (or stored in JSON) as 1.1 is exactly 11/10 here, and `ceil(11/10 * 50)` is 55, where the float
    product 55.00000000000001 would give 56.
    """
    return Fraction(repr(float(cf)))


def capacities(n_local: int, k: int, n_experts: int, shards: int, waves: int,
               cf_send: float, cf_recv: float) -> tuple[int, int]:
    """(sender pool per destination and wave, receiver capacity per expert and wave), in exact arithmetic."""
    a = n_local * k
    pool = math.ceil(exact_factor(cf_send) * a / (shards * waves))
    cap = math.ceil(exact_factor(cf_recv) * a / ((n_experts // shards) * waves))
    return int(pool), int(cap)


def _rank_in_group(groups: jax.Array, valid: jax.Array, n_groups: int) -> jax.Array:
    """For each valid item, how many valid items of its group come before it (array order).

    A stable sort by group keeps array order within a group; rank = sorted position - group start.
    """
    g = jnp.where(valid, groups, n_groups)  # invalid items sort last, in a group of their own
    order = jnp.argsort(g, stable=True)
    sorted_g = g[order]
    rank_sorted = jnp.arange(g.shape[0]) - jnp.searchsorted(sorted_g, sorted_g, side="left")
    return jnp.zeros_like(rank_sorted).at[order].set(rank_sorted)


def dispatch_capacity_local(x_lat, top_e, gates, w1, w3, w2, *, n_experts, shards, waves, pool, cap,
                            wave_order="in_order"):
    """One shard's part of the pooled-wave transport, inside `vmap` or `shard_map` over AXIS.

    x_lat [n, d] local tokens (latent), top_e/gates [n, k], w* [E_local, ...] local experts.
    Returns (combined routed output [n, d], sender drops, receiver drops), drops summed over shards.
    """
    n, k = top_e.shape
    d = x_lat.shape[-1]
    e_local = n_experts // shards
    send_slots, recv_slots = waves * pool, waves * cap

    # sender: rank assignments per destination shard, slot-major then token order
    expert = top_e.T.reshape(-1)
    token = jnp.tile(jnp.arange(n), k)
    dest = expert // e_local
    r_send = _rank_in_group(dest, jnp.ones_like(dest, bool), shards)
    keep_send = r_send < send_slots
    # the slot in the send buffer, wave-major (wave * pool + place in the wave's pool)
    slot_of = r_send if wave_order == "in_order" else (r_send % waves) * pool + r_send // waves
    pos = jnp.where(keep_send, slot_of, send_slots)  # out of range: dropped by the scatter
    send_x = jnp.zeros((shards, send_slots, d), x_lat.dtype).at[dest, pos].set(x_lat[token], mode="drop")
    send_e = jnp.full((shards, send_slots), -1, jnp.int32).at[dest, pos].set(expert % e_local, mode="drop")

    recv_x = jax.lax.all_to_all(send_x, AXIS, 0, 0).reshape(shards * send_slots, d)
    recv_e = jax.lax.all_to_all(send_e, AXIS, 0, 0).reshape(-1)  # order: (sender, wave, pool slot)

    # receiver: per (local expert, wave), keep the first `cap` arrivals
    valid = recv_e >= 0
    wave = jnp.tile(jnp.arange(send_slots) // pool, shards)
    group = jnp.where(valid, recv_e * waves + wave, 0)
    r_recv = _rank_in_group(group, valid, e_local * waves)
    keep_recv = valid & (r_recv < cap)
    e_idx = jnp.where(keep_recv, recv_e, 0)
    slot = jnp.where(keep_recv, wave * cap + r_recv, recv_slots)
    expert_in = jnp.zeros((e_local, recv_slots, d), x_lat.dtype).at[e_idx, slot].set(recv_x, mode="drop")
    expert_out = expert_ffn(expert_in, w1, w3, w2)
    back = expert_out[e_idx, jnp.minimum(slot, recv_slots - 1)]
    back = jnp.where(keep_recv[:, None], back, 0.0).reshape(shards, send_slots, d)

    # back to the senders, then combine each token's kept assignments with its gates
    y_send = jax.lax.all_to_all(back, AXIS, 0, 0)
    y = jnp.where(keep_send[:, None], y_send[dest, jnp.minimum(pos, send_slots - 1)], 0.0)
    out = jnp.einsum("knd,nk->nd", y.reshape(k, n, d), gates)

    sender_dropped = jnp.sum(~keep_send).astype(jnp.int32)
    receiver_dropped = jnp.sum(valid & ~keep_recv).astype(jnp.int32)
    return out, jax.lax.psum(sender_dropped, AXIS), jax.lax.psum(receiver_dropped, AXIS)


def dispatch_capacity(x_lat, top_e, gates, experts: dict, cfg: MoEConfig, mesh=None):
    """Capacity dispatch of all T tokens over S shards: simulated (`vmap`) or on a device mesh."""
    T, k = top_e.shape
    S = cfg.shards
    if T % S:
        raise ValueError(f"{T} tokens do not split into {S} expert shards")
    pool, cap = capacities(T // S, k, cfg.n_experts, S, cfg.waves, cfg.cf_send, cfg.cf_recv)
    local = partial(dispatch_capacity_local, n_experts=cfg.n_experts, shards=S, waves=cfg.waves, pool=pool, cap=cap,
                    wave_order=cfg.wave_order)
    w = (experts["w1"], experts["w3"], experts["w2"])
    if mesh is None:
        split = lambda a: a.reshape(S, a.shape[0] // S, *a.shape[1:])  # noqa: E731
        out, s_drop, r_drop = jax.vmap(local, axis_name=AXIS)(
            split(x_lat), split(top_e), split(gates), *(split(a) for a in w))
        return out.reshape(T, -1), s_drop[0], r_drop[0]
    if mesh.shape[AXIS] != S:
        raise ValueError(f"mesh has {mesh.shape[AXIS]} devices on {AXIS!r}, config has {S} shards")
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(P(AXIS),) * 6, out_specs=(P(AXIS), P(), P()))
    return sharded(x_lat, top_e, gates, *w)


def dispatch_dropless(x_lat, top_e, gates, experts: dict):
    """Every assignment kept: sort by expert, grouped matmuls (`ragged_dot`), unsort, combine."""
    T, k = top_e.shape
    E = experts["w1"].shape[0]
    flat = top_e.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    xs = x_lat[order // k]
    sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
    h = jax.nn.silu(jax.lax.ragged_dot(xs, experts["w1"], sizes)) * jax.lax.ragged_dot(xs, experts["w3"], sizes)
    ys = jax.lax.ragged_dot(h, experts["w2"], sizes)
    y = jnp.zeros_like(ys).at[order].set(ys).reshape(T, k, -1)
    return jnp.einsum("tkd,tk->td", y, gates)


def shared_experts(x: jax.Array, shared: dict) -> jax.Array:
    h = jax.nn.silu(jnp.einsum("td,sdf->stf", x, shared["w1"])) * jnp.einsum("td,sdf->stf", x, shared["w3"])
    return jnp.einsum("stf,sfd->td", h, shared["w2"])


def moe_layer(p: dict, x: jax.Array, cfg: MoEConfig, mesh=None) -> tuple[jax.Array, dict]:
    """x [T, d_model] -> (out [T, d_model], extras: drops, loads, entropy, lb_loss, z_loss)."""
    logits, probs, top_e, gates = route(x, p["router"], cfg.top_k)  # gate, route
    x_lat = x @ p["down"]  # compress before dispatch
    if cfg.dispatch == "dropless":
        y_lat = dispatch_dropless(x_lat, top_e, gates, p["experts"])
        s_drop = r_drop = jnp.zeros((), jnp.int32)
    else:
        y_lat, s_drop, r_drop = dispatch_capacity(x_lat, top_e, gates, p["experts"], cfg, mesh)
    out = shared_experts(x, p["shared"]) + y_lat @ p["up"]  # expand, add the shared path
    extras = router_stats(logits, probs, top_e, cfg.n_experts)
    extras.update(sender_dropped=s_drop, receiver_dropped=r_drop,
                  assignments=jnp.asarray(top_e.size, jnp.int32))
    return out, extras
