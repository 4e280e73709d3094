"""A run's whole history read back in Python: `runledger.Api().run(R).history(keys)` against MLflow's
`MlflowClient.get_metric_history(run, key)` on a local sqlite store, for one run of N steps x 20 names.

    python -m bench.history [--steps 1000000] [--reps 3] [--only runledger]

Both stores hold the same numbers (bench.peers' --query run: runledger's own writer, ParquetSink, for the
ledger; MLflow's own tables, filled in bulk after MLflow logged step 0, for MLflow). Each side returns every
point (runledger: one Arrow table of every step, a column per name; MLflow: a list of Metric objects per name),
and each answer is checked against the other, value for value. Timed in this process, the stores' imports
before any clock; the first read (cold) and the median of `reps` more. The ratio is runledger / MLflow (below 1:
runledger is faster).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

from bench.peers import FREE_NAMES, RUN_ID, fill_mlflow, fill_runledger

log = logging.getLogger("bench.history")


def read_runledger(root: str) -> dict[str, list[float]]:
    import runledger

    table = runledger.Api(root=root).run(RUN_ID).history(list(FREE_NAMES))
    return {k: table.column(k).to_pylist() for k in FREE_NAMES}


def read_mlflow(db: str, run_id: str) -> dict[str, list[float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    return {k: [m.value for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)] for k in FREE_NAMES}


def timed(read, reps: int) -> tuple[float, float, dict]:
    t = time.perf_counter()
    got = read()
    cold = time.perf_counter() - t
    warm = []
    for _ in range(reps):
        t = time.perf_counter()
        read()
        warm.append(time.perf_counter() - t)
    return cold, statistics.median(warm) if warm else cold, got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", choices=["runledger"], default=None, help="runledger's side alone (no ratio)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import mlflow  # noqa: F401  (imports before any clock)
    import pyarrow  # noqa: F401

    import runledger.api  # noqa: F401

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        q = mp.get_context("spawn").Queue()
        where = {}
        sides = (("runledger", fill_runledger),) if args.only else (("runledger", fill_runledger), ("mlflow", fill_mlflow))
        for name, fill in sides:
            folder = Path(tmp) / name
            folder.mkdir()
            proc = mp.get_context("spawn").Process(target=fill, args=(str(folder), args.steps, q))
            proc.start()
            got_name, info = q.get()
            proc.join()
            where[got_name] = info
            log.info("filled %s (%d steps x %d names) in %.1f s", got_name, args.steps, len(FREE_NAMES), info["fill_s"])
        ours = timed(lambda: read_runledger(where["runledger"]["root"]), args.reps)
        if args.only:
            points = sum(len(v) for v in ours[2].values())
            print(f"history of {args.steps:,} steps x {len(FREE_NAMES)} names ({points:,} points)")
            print(f"  runledger Api().run(R).history(keys)   cold {ours[0]:.2f} s  warm {ours[1]:.2f} s")
            return
        theirs = timed(lambda: read_mlflow(where["mlflow"]["db"], where["mlflow"]["run_id"]), args.reps)
        same = all(ours[2][k] == theirs[2][k] for k in FREE_NAMES)
        points = sum(len(v) for v in ours[2].values())
        print(f"history of {args.steps:,} steps x {len(FREE_NAMES)} names ({points:,} points each, identical: {same})")
        print(f"  runledger Api().run(R).history(keys)   cold {ours[0]:.2f} s  warm {ours[1]:.2f} s")
        print(f"  MLflow get_metric_history x {len(FREE_NAMES)}        cold {theirs[0]:.2f} s  warm {theirs[1]:.2f} s")
        print(f"  ratio runledger / MLflow: cold {ours[0] / theirs[0]:.3f}, warm {ours[1] / theirs[1]:.3f}")


if __name__ == "__main__":
    main()
