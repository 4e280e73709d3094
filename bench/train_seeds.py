"""Healthy real runs for the health checks' false alarms: seeds of a preset trained at its full length by
the real worker into one ledger root (its own Parquet sink, no NATS), for `python -m bench.health --real ROOT`.

    nice -n 19 python -m bench.train_seeds --preset small --seeds 0 1 2 --root /tmp/h43c/small
    python -m bench.train_seeds --audit --root /tmp/h43c/small    # each run's health checks that warn or fail

Each run is `{preset}-s{seed}`, the preset with only its seed changed; a fixed peak (1e11 FLOP/s, as the
tests) keeps each run from measuring the machine. A run already in the root is skipped, so the command can
be stopped and started again, and several can fill one root with different seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import tempfile
from pathlib import Path

from runledger import queries
from runledger.ledger.emit.sink import ParquetSink
from runledger.queries import audit
from runledger.training.config import preset
from runledger.training.worker import train

log = logging.getLogger("bench.train_seeds")
PEAK = 1e11


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seeds", type=int, nargs="+", default=[])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=None, help="stop here (default: the preset's full length)")
    ap.add_argument("--audit", action="store_true", help="then audit every finished run in the root")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for seed in args.seeds:
        run_id = f"{args.preset}-s{seed}"
        if (args.root / "events" / "kind=run_finished" / f"run_id={run_id}").exists():
            log.info("%s: in the root already", run_id)
            continue
        cfg = dataclasses.replace(preset(args.preset), seed=seed)
        with tempfile.TemporaryDirectory() as ckpts, ParquetSink(args.root, run_id, "worker-0", 0) as sink:
            result = train(cfg, run_id=run_id, ckpt_dir=ckpts, sink=sink, steps=args.steps, preset=args.preset,
                           peak_flops=PEAK, attest=False)
        log.info("%s: %s at step %d", run_id, result.status, result.final_step)
    if args.audit:
        report(args.root)


def report(root: Path) -> None:
    """One line per finished run: its last step and the health checks that warn or fail; then the counts."""
    con = queries.connect(root)
    finished = dict(con.execute("select run_id, final_step from runs_finished where status = 'completed'").fetchall())
    fired = {}
    for run_id in sorted(finished):
        rows = audit.run_suite(root, "health", run_id).rows()
        fired[run_id] = sorted(f"{r['check']}:{r['status']}" for r in rows if r["status"] in ("warn", "fail"))
        print(f"{run_id}: {finished[run_id]} steps, warn/fail: {', '.join(fired[run_id]) or 'none'}", flush=True)
    print(f"{len(finished)} runs; {sum(1 for f in fired.values() if f)} with a warn or fail")


if __name__ == "__main__":
    main()
