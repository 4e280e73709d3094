"""Training throughput: MFU of the `small` preset against this machine's measured matmul peak, and
the step time with events emitted (a real Emitter publishing to a real local NATS) vs emission off,
in the same process, interleaved so that drift hits both alike. On a shared machine wall-clock
differences of a few percent are noise; the time inside `emit` and the process CPU time per step
are the steadier measures of the overhead.

    .venv/bin/python -m bench.train [--preset small] [--steps 10] [--rounds 3]

Each timed step is the worker's loop body: batch, lr into the optimizer, jitted update, metrics to
the host, and (when on) the `step` and `drops` payloads built and emitted.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import jax

from runledger.training import data
from runledger.training.config import preset
from runledger.training.flops import flops_per_token, measure_peak_flops
from runledger.training.schedule import lr_at, make_schedule
from runledger.training.record import step_completed, tokens_dropped
from runledger.training.worker import init_state, make_train_step, with_lr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=3, help="off/on block pairs")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cfg = preset(args.preset)
    T, L = cfg.tokens_per_step, cfg.model.seq_len
    peak = measure_peak_flops()
    fpt = flops_per_token(cfg)
    corpus, mixture = data.load_corpus(cfg.data), cfg.data.mixture_dict()
    sched = make_schedule(cfg.optim.peak_lr, cfg.optim.warmup_steps, cfg.steps, cfg.optim.min_lr_ratio)
    state = init_state(cfg)
    step_fn = make_train_step(cfg)
    t0 = time.perf_counter()
    batch0 = {**data.batch_at(corpus, mixture, cfg.seed, 1, cfg.batch_size, L), "poison": jax.numpy.float32(0)}
    step_fn = step_fn.lower(with_lr(state, 0.0), batch0).compile()
    compile_s = time.perf_counter() - t0

    from runledger.ledger.emit.emitter import Emitter
    from runledger.ledger.bus.natsserver import NatsServer

    tmp = tempfile.TemporaryDirectory()
    server = NatsServer(Path(tmp.name) / "nats").start()

    emitter = Emitter("bench-train", "worker-0", 0, server.url, Path(tmp.name) / "spool")
    k = 0

    emit_s = [0.0]  # wall time spent inside the emit calls (the caller-side cost)
    cpu = {False: 0.0, True: 0.0}  # process CPU time per mode (includes the publisher thread)

    def block(emit: bool) -> list[float]:
        nonlocal state, k
        times = []
        c0 = time.process_time()
        for _ in range(args.steps):
            k += 1
            t = time.perf_counter()
            batch = data.batch_at(corpus, mixture, cfg.seed, k, cfg.batch_size, L)
            batch["poison"] = jax.numpy.float32(0)
            state = with_lr(state, lr_at(k, **sched))
            t_step = time.perf_counter()
            state, metrics = step_fn(state, batch)
            m = jax.device_get(metrics)
            dt = time.perf_counter() - t_step
            if emit:
                t_emit = time.perf_counter()
                emitter.emit(step_completed(m, T, L, dt, fpt, peak), step=k)
                emitter.emit(tokens_dropped(m["layers"], cfg, L), step=k)
                emit_s[0] += time.perf_counter() - t_emit
            times.append(time.perf_counter() - t)
        cpu[emit] += time.process_time() - c0
        return times

    block(False)  # warm-up
    off, on = [], []
    for _ in range(args.rounds):
        off += block(False)
        on += block(True)
    emitter.close()
    server.stop()
    tmp.cleanup()

    med_off, med_on = statistics.median(off), statistics.median(on)
    mean_off, mean_on = statistics.fmean(off), statistics.fmean(on)
    mfu = fpt * T / med_off / peak
    print(f"preset {args.preset}: {T} tokens/step, {fpt / 1e6:.2f} MFLOP/token (active params + attention), "
          f"compile {compile_s:.1f}s")
    print(f"measured matmul peak      {peak / 1e9:8.1f} GFLOP/s ({jax.devices()[0].device_kind}, {jax.device_count()} device)")
    print(f"step time, emission off   {1e3 * med_off:8.1f} ms median, {1e3 * mean_off:.1f} ms mean ({len(off)} steps)")
    print(f"step time, emission on    {1e3 * med_on:8.1f} ms median, {1e3 * mean_on:.1f} ms mean ({len(on)} steps)")
    print(f"emission overhead         {100 * (med_on / med_off - 1):+8.2f} % median, {100 * (mean_on / mean_off - 1):+.2f} % mean")
    print(f"emit calls (caller side)  {1e3 * emit_s[0] / len(on):8.2f} ms per step = "
          f"{100 * emit_s[0] / len(on) / med_off:.2f} % of the step")
    print(f"process CPU per step      off {1e3 * cpu[False] / len(off):.1f} ms, on {1e3 * cpu[True] / len(on):.1f} ms "
          f"({100 * (cpu[True] / cpu[False] - 1):+.2f} %, includes the publisher thread)")
    print(f"throughput                {T / med_off:8.0f} tokens/s, {fpt * T / med_off / 1e9:.1f} GFLOP/s")
    print(f"MFU vs measured peak      {100 * mfu:8.1f} %")


if __name__ == "__main__":
    main()
