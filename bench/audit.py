"""Benchmark of the health audit: 10M synthetic step events over 100 runs, the suite over all runs,
one 400,000-step run, and the ratio to a bare count(*) scan of the same Parquet files (the ledger's
Iceberg tables).

    python -m bench.audit [--small] [--root DIR] [--threads 2]

How the ledger is made: `run_started`, `eval`, `drops`, `checkpoint` and `run_finished` events are
sealed and written by a `runledger.ledger.emit.sink.ParquetSink` (the real sealing and the real writer). The
10M step events are too many to seal one by one in a benchmark's setup, so they are built as Arrow
tables with the writer's own schema (`runledger.ledger.storage.rows.arrow_schema('step')`) and written through
`runledger.ledger.storage.files.write_atomic` with the table's field ids, one file per 200,000 steps, each committed; their hashes are random 64-hex strings
chained through prev_hash (not the SHA-256 of their content) and their `payload` text is built
column-wise, so `runledger verify` would reject them; the audits read only the typed columns.

What is timed (best of --repeat): the suite over all runs on one open connection over the whole
ledger (its helper tables rebuilt each time), and one run the way `runledger audit health RUN`
does it, connection over the run's files included. Each is shown in wall and CPU seconds (this
process's user+sys): on a machine busy with other work, wall time grows and CPU time much less.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.emit.sink import ParquetSink
from runledger.ledger.storage import store
from runledger.ledger.storage.files import partition_dir, write_atomic
from runledger.ledger.storage.paths import event_files
from runledger.ledger.storage.rows import arrow_schema

log = logging.getLogger("bench.audit")

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
TOKENS_PER_STEP = 4096
STEP_TIME_S = 0.5
FILE_ROWS = 200_000
N_EXPERTS = 64


def schedule_lr(step: np.ndarray, peak: float, warmup: int, horizon: int, min_ratio: float) -> np.ndarray:
    """runledger.training.schedule.lr_at, vectorised (no retime)."""
    floor = min_ratio * peak
    warm = peak * np.maximum(step, 1) / warmup
    decay = peak + (floor - peak) * (step - warmup) / max(horizon - warmup, 1)
    return np.where(step >= horizon, floor, np.where(step < warmup, warm, decay))


def step_files(root: Path, run_id: str, n_steps: int, seq0: int, prev0: str, sched: dict, rng) -> tuple[int, str]:
    """Write a run's step events as Arrow tables in the writer's schema; return (next seq, last hash)."""
    schema = arrow_schema("step")
    tables = store.tables_of(root)
    seq, prev = seq0, prev0
    for start in range(0, n_steps, FILE_ROWS):
        m = min(FILE_ROWS, n_steps - start)
        step = np.arange(start + 1, start + m + 1, dtype=np.int64)
        seqs = np.arange(seq, seq + m, dtype=np.int64)
        secs = step * STEP_TIME_S
        ts = np.datetime64(T0.replace(tzinfo=None), "us") + (secs * 1e6).astype("timedelta64[us]")
        ts_arr = pa.array(ts, pa.timestamp("us", tz="UTC"))
        time_str = pc.binary_join_element_wise(pc.strftime(ts_arr, format="%Y-%m-%dT%H:%M:%S"), "Z", "")
        hexes = os.urandom(32 * m).hex()
        hashes = [hexes[i * 64:(i + 1) * 64] for i in range(m)]
        prevs = [prev] + hashes[:-1]
        loss = 2.0 + 8.0 / np.sqrt(step) + rng.normal(0, 0.02, m)
        grad = 0.3 + 0.05 * rng.random(m)
        lr = schedule_lr(step, sched["peak_lr"], sched["warmup_steps"], sched["horizon_steps"], sched["min_lr_ratio"])
        mfu = 0.4 + 0.005 * rng.random(m)
        cols = {
            "loss": loss, "grad_norm": grad, "lr": lr, "tokens": np.full(m, TOKENS_PER_STEP),
            "step_time_s": np.full(m, STEP_TIME_S), "param_norm": 100.0 + step * 1e-4,
            "z_loss": 1e-3 * np.ones(m), "lb_loss": 1.0 + 0.01 * rng.random(m),
            "router_entropy": math.log(N_EXPERTS) * (0.97 + 0.01 * rng.random(m)), "mfu": mfu,
            "tokens_per_s": np.full(m, TOKENS_PER_STEP / STEP_TIME_S), "seq_len": np.full(m, 1024),
            "skipped": np.zeros(m, dtype=bool), "flops_per_token": pa.nulls(m, pa.float64()),
        }
        seq_s = pc.cast(pa.array(seqs), pa.string())
        payload = pc.binary_join_element_wise(
            '{"grad_norm":', pc.cast(pa.array(grad), pa.string()), ',"loss":', pc.cast(pa.array(loss), pa.string()),
            ',"lr":', pc.cast(pa.array(lr), pa.string()), ',"mfu":', pc.cast(pa.array(mfu), pa.string()),
            f',"step_time_s":{STEP_TIME_S},"tokens":{TOKENS_PER_STEP}}}', "")
        env = {
            "event_id": pc.binary_join_element_wise(f"{run_id}:worker-0:0:", seq_s, ""),
            "run_id": pa.array(np.full(m, run_id, dtype=object), pa.string()),
            "producer": pa.array(np.full(m, "worker-0", dtype=object), pa.string()),
            "attempt": np.zeros(m, dtype=np.int64), "seq": seqs,
            "kind": pa.array(np.full(m, "step", dtype=object), pa.string()), "time": time_str, "ts": ts_arr,
            "step": step, "schema_version": np.ones(m, dtype=np.int64), "prev_hash": prevs, "hash": hashes,
            "payload": payload, "stream_seq": seqs, "ingested_at": ts_arr,
        }
        data = {**env, **cols}
        table = pa.table([pa.array(data[f.name], f.type) if not isinstance(data[f.name], pa.Array) else data[f.name].cast(f.type)
                          for f in schema], schema=schema)
        path = partition_dir(root, "step", run_id) / f"part-{seq:012d}-{seq + m - 1:012d}-bench.parquet"
        write_atomic(tables.with_field_ids("step", table), path)
        tables.commit({"step": [path]})
        seq, prev = seq + m, hashes[-1]
    return seq, prev


def make_run(root: Path, run_id: str, n_steps: int, rng) -> None:
    """One synthetic, healthy run: run_started, steps, drops every 100 steps, evals every 1000,
    checkpoints every 10,000, run_finished."""
    warmup = max(n_steps // 100, 1)
    sched = {"peak_lr": 3e-3, "warmup_steps": warmup, "horizon_steps": n_steps, "min_lr_ratio": 0.05,
             "tokens_per_step": TOKENS_PER_STEP, "horizon_tokens": n_steps * TOKENS_PER_STEP}
    config = {"moe": {"n_experts": N_EXPERTS}, "steps": n_steps, "bench": True}
    import hashlib

    chash = hashlib.sha256(canonical_json(config).encode()).hexdigest()
    meta = ParquetSink(root, run_id, "bench-meta", stream_seqs=itertools.count(0), flush_every=None)
    meta.emit_dict("run_started", {
        "config": config, "config_hash": chash, "code_commit": "bench", "token_budget": n_steps * TOKENS_PER_STEP,
        "tokens_per_step": TOKENS_PER_STEP, "schedule": sched, "planned_tokens_per_s": TOKENS_PER_STEP / STEP_TIME_S * 0.95,
    }, 0, T0)
    step_files(root, run_id, n_steps, 0, "", sched, rng)
    for s in range(100, n_steps + 1, 100):
        at = T0 + timedelta(seconds=s * STEP_TIME_S)
        meta.emit_dict("drops", {"dispatch": "capacity", "assignments": 8192, "dropped": 80, "drop_fraction": 80 / 8192}, s, at)
        if s % 1000 == 0:
            meta.emit_dict("eval", {"loss": 2.0 + 8.0 / math.sqrt(s)}, s, at)
        if s % 10_000 == 0:
            meta.emit_dict("checkpoint", {"path": f"ckpt/{s}", "bytes": 1, "seconds": 1.0, "content_hash": f"{s:064x}",
                                     "config_hash": chash, "tokens_seen": s * TOKENS_PER_STEP}, s, at)
    meta.emit_dict("run_finished", {"status": "completed", "final_step": n_steps}, n_steps,
                   T0 + timedelta(seconds=n_steps * STEP_TIME_S + 1))
    meta.close()


def make_ledger(root: Path, n_runs: int, total_steps: int, big_steps: int) -> str:
    """`n_runs` runs with `total_steps` steps in all, one of them `big_steps` long; return its id."""
    rng = np.random.default_rng(0)
    per_run = (total_steps - big_steps) // (n_runs - 1)
    big = "run-big"
    make_run(root, big, big_steps, rng)
    for i in range(n_runs - 1):
        make_run(root, f"run-{i:03d}", per_run, rng)
        log.info("wrote run %d/%d", i + 2, n_runs)
    return big


def best_of(n: int, fn) -> tuple[float, float]:
    """(wall, cpu) seconds of the fastest of n calls; cpu is this process's user+sys time, which
    other load on the machine inflates less than wall time."""
    best = (math.inf, math.inf)
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


# every column the health suite reads from the step files: a scan that reads them all is the I/O floor
SCAN_ALL_READ = """select count(*), sum(loss), sum(grad_norm), sum(lr), sum(param_norm), sum(router_entropy), sum(mfu),
    sum(tokens_per_s), sum(tokens), max(ts), sum(step), sum(attempt), count(*) filter (skipped), count(distinct run_id)
    from steps_all"""


def measure(root: Path, threads: int, repeat: int) -> dict:
    """The timed measures over one root (see the module docstring)."""
    from runledger import queries
    from runledger.queries import audit
    from runledger.queries.columns import kind_columns

    big = "run-big"
    t0, c0 = time.perf_counter(), time.process_time()
    con = queries.connect(root, threads=threads)
    out = {"connect": (time.perf_counter() - t0, time.process_time() - c0)}
    out["n_steps"] = con.execute("select count(*) from steps_all").fetchone()[0]
    out["count"] = best_of(repeat, lambda: con.execute("select count(*) from steps_all").fetchall())
    out["scan"] = best_of(repeat, lambda: con.execute(SCAN_ALL_READ).fetchall())
    all_runs = {}
    out["suite"] = best_of(repeat, lambda: all_runs.update(a=audit.run_suite(root, "health", None, con=con)))
    # one run as `runledger audit health RUN` does it: its own connection over the run's files
    out["one"] = best_of(repeat, lambda: audit.run_suite(root, "health", big, threads=threads))
    out["one_count"] = best_of(repeat, lambda: con.execute(
        f"select count(*) from {queries.scan_files(event_files(root, 'step', big), kind_columns('step'))}").fetchall())
    out["rows"] = all_runs["a"].rows()
    out["statuses"] = {s: sum(1 for r in out["rows"] if r["status"] == s) for s in audit.STATUSES}
    out["slowest"] = sorted(all_runs["a"].results, key=lambda r: -r.seconds)[:3]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="1M steps over 10 runs, one of 40,000 steps")
    ap.add_argument("--root", default=None, help="ledger to (re)use; made here if it has no events yet")
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads (the target is on 2 cores)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("runledger.queries.audit").setLevel(logging.WARNING)

    n_runs, total, big_steps = (10, 1_000_000, 40_000) if args.small else (100, 10_000_000, 400_000)
    tmp = None
    if args.root:
        root = Path(args.root)
    else:
        tmp = tempfile.mkdtemp(prefix="runledger-bench-audit-")
        root = Path(tmp) / "ledger"
    try:
        if not (root / "tables.json").exists():
            t0 = time.perf_counter()
            make_ledger(root, n_runs, total, big_steps)
            log.info("wrote %d steps over %d runs in %.1fs", total, n_runs, time.perf_counter() - t0)
        tables = measure(root, args.threads, args.repeat)
        size = sum(f.stat().st_size for f in event_files(root))
        load = os.getloadavg()[0]

        def line(what: str, key: str, target: str = "") -> str:
            t = tables[key]
            return (f"{what:52s} {t[0]:8.3f} {t[1]:8.3f} "
                    f"{t[0] / tables['count'][0] if key != 'connect' else math.nan:11.1f} {target:>8s}")

        lines = [
            f"ledger: {tables['n_steps']:,} step events over {n_runs} runs ({size / 2**30:.2f} GiB of Parquet); "
            f"DuckDB threads={args.threads}; {os.cpu_count()} cpus, load average {load:.1f}; best of {args.repeat}",
            f"{'measure':52s} {'wall/cpu s':>17s} {'x count(*)':>11s} {'target':>8s}",
            line("bare count(*) over all step files", "count"),
            line("scan of every step column the suite reads", "scan"),
            line("health suite (16 checks), all runs", "suite", "< 5 s"),
            line(f"health suite, one run of {big_steps:,} steps (incl. connect)", "one", "< 0.5 s"),
            line("connect over the whole ledger (binds every view)", "connect"),
            f"(x count(*): to the count(*) over all step files; for the one run, over that run's files: "
            f"{tables['one_count'][0]:.4f} s, one run {tables['one'][0] / tables['one_count'][0]:.1f}x)",
            f"all-runs suite: {len(tables['rows'])} rows {tables['statuses']}; slowest: "
            + ", ".join(f"{x.name} {x.seconds:.2f}s" for x in tables["slowest"]),
        ]
        print("\n".join(lines))
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
