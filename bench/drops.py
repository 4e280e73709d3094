"""Token drops vs sequence length at a fixed number of tokens per batch, capacity vs dropless.

A small reproduction of Marin's observation (about 7% drops at 4K context, about 40% at 65K): with the
tokens per batch fixed, longer sequences mean fewer sequences per expert shard, so each shard's
tokens come from fewer documents, its routing is less balanced, and more assignments overflow the
pooled-wave capacity. The router is first trained briefly (so routing depends on content), then the
same params are measured on batches of 1x, 4x and 16x the sequence length.

    .venv/bin/python bench/drops.py            # prints the table (about a minute on 2 CPU cores)
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from training import data  # noqa: E402
from training.config import PRESETS  # noqa: E402
from training.model import loss_fn  # noqa: E402
from training.worker import train  # noqa: E402

TOKENS_PER_BATCH = 8192
SHORT = 64
BATCHES = 3


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    base = PRESETS["tiny"]
    cfg = dataclasses.replace(base, moe=dataclasses.replace(base.moe, shards=4), steps=150, batch_size=16,
                              eval_every=10_000, ckpt_every=10_000, log_every=10_000)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        params = train(cfg, run_id="bench-drops", ckpt_dir=d, peak_flops=1.0).state["params"]
    trained_s = time.perf_counter() - t0
    corpus, mixture = data.load_corpus(cfg.data), cfg.data.mixture_dict()

    print(f"router trained for {cfg.steps} steps of {cfg.tokens_per_step} tokens ({trained_s:.0f}s); "
          f"{TOKENS_PER_BATCH} tokens per batch, S={cfg.moe.shards} shards, W={cfg.moe.waves} waves, "
          f"cf_send={cfg.moe.cf_send}, cf_recv={cfg.moe.cf_recv}, E={cfg.moe.n_experts}, k={cfg.moe.top_k}")
    print(f"{'seq_len':>8} {'x':>4} {'seqs/shard':>10} {'dispatch':>9} {'drop %':>7} {'sender %':>9} "
          f"{'receiver %':>10} {'loss':>7}")
    rows = []
    for mult in (1, 4, 16):
        L = SHORT * mult
        B = TOKENS_PER_BATCH // L
        for dispatch in ("capacity", "dropless"):
            c = dataclasses.replace(cfg, batch_size=B, model=dataclasses.replace(cfg.model, seq_len=L),
                                    moe=dataclasses.replace(cfg.moe, dispatch=dispatch))
            fn = jax.jit(lambda p, b, c=c: loss_fn(p, b, c))
            s = r = a = 0
            losses = []
            for i in range(BATCHES):
                batch = data.batch_at(corpus, mixture, 99, 10_000 + i, B, L)
                _, aux = fn(params, batch)
                layers = jax.device_get(aux["layers"])
                s += int(layers["sender_dropped"].sum())
                r += int(layers["receiver_dropped"].sum())
                a += int(layers["assignments"].sum())
                losses.append(float(aux["ce"]))
            rows.append((L, mult, dispatch, (s + r) / a))
            print(f"{L:>8} {mult:>4} {B // cfg.moe.shards:>10} {dispatch:>9} {100 * (s + r) / a:>7.2f} "
                  f"{100 * s / a:>9.2f} {100 * r / a:>10.2f} {np.mean(losses):>7.3f}")
    cap = {m: f for _, m, d, f in rows if d == "capacity"}
    print(f"capacity drop fraction vs 1x: 4x = {cap[4] / cap[1]:.2f}x, 16x = {cap[16] / cap[1]:.2f}x "
          f"(total {time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
    main()
