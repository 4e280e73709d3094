"""Token drops over training, per sequence length and per wave order: what the demo's drop numbers are.

The demo's main run is preset `small` (sequence length 128, 1024 tokens per step, S=2 shards, W=3
waves, cf 1.10/1.15), and it probes an 8x context extension over its first 12 steps. A drop fraction
is not one number: it moves as the router trains. This bench trains `small` for STEPS updates (the
worker's own jitted step, in-order waves, the model's default) and, before update k at each probe
step, measures the drop fraction of the same params at 1x, 4x and 8x the length (same tokens per
batch, as the worker's probes do), with waves filled in order (the model's: wave = rank // pool) and
round-robin (wave = rank % W). It prints the distribution over training per (length, order): min,
median, max, mean, and the means over steps 1-12 (the demo's probe window) and over the last 12.

    .venv/bin/python -m bench.drops [--steps 60]   # a few minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time

import jax
import numpy as np

from runledger.training import data
from runledger.training.config import PRESETS, TrainConfig
from runledger.training.schedule import lr_at, make_schedule
from runledger.training.worker import init_state, make_probe, make_train_step, with_lr

log = logging.getLogger("bench.drops")

PRESET = "small"  # the demo's main run (tools/demo.py FULL)
MULTS = (1, 4, 8)  # 8x: the demo's context extension (128 -> 1024)
ORDERS = ("in_order", "round_robin")
DEMO_PROBE_STEPS = 12  # the demo extends at step 12 and probes before it
PROBE_EARLY_EVERY, PROBE_LATE_EVERY = 2, 4  # as the worker's probes (every 2 steps), sparser afterwards


def at(cfg: TrainConfig, mult: int, order: str) -> TrainConfig:
    """`cfg` at `mult` times its length (same tokens per batch) with waves filled in `order`."""
    L = cfg.model.seq_len * mult
    return dataclasses.replace(cfg, batch_size=max(cfg.batch_size // mult, 1),
                               model=dataclasses.replace(cfg.model, seq_len=L),
                               moe=dataclasses.replace(cfg.moe, wave_order=order))


def fraction(layers: dict) -> tuple[float, float, float]:
    """(drop fraction, sender share, receiver share) of all layers' assignments."""
    a = float(np.sum(layers["assignments"]))
    s, r = float(np.sum(layers["sender_dropped"])), float(np.sum(layers["receiver_dropped"]))
    return (s + r) / a, s / a, r / a


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)  # (jax's absl set a handler)
    for noisy in ("absl", "jax._src.xla_bridge"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = dataclasses.replace(PRESETS[PRESET], steps=args.steps)
    m = cfg.moe
    log.info("preset %s: seq_len %d, %d tokens per batch, S=%d shards, W=%d waves, cf_send=%s, cf_recv=%s, E=%d, "
             "k=%d; %d updates (in-order waves)", PRESET, cfg.model.seq_len, cfg.tokens_per_step, m.shards, m.waves,
             m.cf_send, m.cf_recv, m.n_experts, m.top_k, args.steps)
    t0 = time.perf_counter()
    corpus, mixture = data.load_corpus(cfg.data), cfg.data.mixture_dict()
    sched = make_schedule(cfg.optim.peak_lr, cfg.optim.warmup_steps, cfg.steps, cfg.optim.min_lr_ratio)
    state = init_state(cfg)
    train_step = make_train_step(cfg)
    probes = {(mult, order): make_probe(at(cfg, mult, order)) for mult in MULTS for order in ORDERS}
    probe_steps = {k for k in range(1, args.steps + 1)
                   if k == 1 or (k <= DEMO_PROBE_STEPS and k % PROBE_EARLY_EVERY == 0) or k % PROBE_LATE_EVERY == 0}
    seen: dict[tuple[int, str], list[tuple[int, float, float, float]]] = {key: [] for key in probes}
    trained: list[float] = []  # the drop fraction each update itself recorded (1x, in order)
    for k in range(1, args.steps + 1):
        if k in probe_steps:
            for (mult, order), fn in probes.items():
                c = at(cfg, mult, order)
                b = data.batch_at(corpus, mixture, c.seed, k, c.batch_size, c.model.seq_len)
                seen[(mult, order)].append((k, *fraction(jax.device_get(fn(state["params"], b)))))
        batch = {**data.batch_at(corpus, mixture, cfg.seed, k, cfg.batch_size, cfg.model.seq_len), "poison": np.float32(0)}
        state, metrics = train_step(with_lr(state, lr_at(k, **sched)), batch)
        trained.append(fraction(jax.device_get(metrics["layers"]))[0])
    same = all(abs(f - trained[k - 1]) < 1e-12 for k, f, _, _ in seen[(1, "in_order")])
    log.info("trained and probed in %.0fs; the 1x in-order probes equal the updates' own accounting: %s",
             time.perf_counter() - t0, same)

    def row(label: str, ks: list[int], fs: list[float], sender: list[float] | None = None,
            receiver: list[float] | None = None) -> None:
        f = np.array(fs)
        early = [x for k, x in zip(ks, fs) if k <= DEMO_PROBE_STEPS]
        late = [x for k, x in zip(ks, fs) if k > args.steps - DEMO_PROBE_STEPS]
        extra = f" {100 * np.mean(sender):>8.1f} {100 * np.mean(receiver):>9.1f}" if sender else f" {'':>8} {'':>9}"
        print(f"{label:<22} {len(f):>5} {100 * f.min():>6.1f} {100 * np.median(f):>6.1f} {100 * f.max():>6.1f} "
              f"{100 * f.mean():>6.1f} {100 * np.mean(early):>8.1f} {100 * np.mean(late):>8.1f}{extra}")

    print(f"drop fraction (%) over {args.steps} updates of {PRESET}; probes before update k at steps "
          f"{min(probe_steps)}..{max(probe_steps)} ({len(probe_steps)} of them)")
    print(f"{'length, wave order':<22} {'steps':>5} {'min':>6} {'median':>6} {'max':>6} {'mean':>6} "
          f"{'mean 1-12':>8} {'mean last 12':>8} {'sender':>8} {'receiver':>9}")
    row(f"{cfg.model.seq_len} (1x) updates", list(range(1, args.steps + 1)), trained)
    for (mult, order), rows in seen.items():
        ks, fs, ss, rs = (list(v) for v in zip(*rows))
        row(f"{cfg.model.seq_len * mult} ({mult}x) {order}", ks, fs, ss, rs)
    for mult in MULTS:
        io = np.mean([f for _, f, _, _ in seen[(mult, "in_order")]])
        rr = np.mean([f for _, f, _, _ in seen[(mult, "round_robin")]])
        print(f"{mult}x: round-robin / in-order mean drop fraction = {rr / io:.2f}")
    log.info("total %.0fs", time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
