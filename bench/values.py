"""`log` with one histogram per step (issue 40): runledger against W&B offline, each in a fresh process.

    python -m bench.values [--steps N] [--buckets B] [--rounds R]

Each step logs {"loss": x, "h": Histogram(np_histogram=(counts, edges))} of B buckets (the counts of 100,000 normal
draws, made before the loop, so that what is timed is the logging call, not numpy.histogram):
  runledger        `runledger.init(root=)` on the embedded local server and ledger; each `log` seals a `histogram`
                   and a `metrics` event and spools them before it returns; `finish` waits until the ledger stored both
  runledger-off    the same with mode="offline" (spooled only: what the client itself costs)
  wandb            `wandb.init(mode="offline")` and `wandb.log` into the local .wandb file; W&B keeps at most 512
                   buckets (wandb.Histogram.MAX_LENGTH: more is an error), so it logs min(B, 512)
Printed per peer: the median time inside `log` per step, its 99th percentile, and loop end -> `finish` returned;
then the ratio of runledger's per-step time to W&B's (below 1: runledger is cheaper). The rounds alternate the
order of the peers; the median over rounds is printed. Load average before and after: the machine's other work
moves absolute figures, the ratio much less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
import numpy as np
peer, steps, buckets, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(0)
hists = [np.histogram(rng.normal(size=100_000), bins=buckets) for _ in range(8)]
if peer.startswith("runledger"):
    import runledger as lib
    run = lib.init(project="bench-values", root=os.path.join(where, "root"), system_metrics=False,
                   mode="offline" if peer == "runledger-off" else None)
else:
    import wandb as lib
    run = lib.init(project="bench-values", dir=where, mode="offline")
times = []
for step in range(steps):
    counts, edges = hists[step % len(hists)]
    value = {"loss": 1.0 / (step + 1), "h": lib.Histogram(np_histogram=(counts, edges))}
    t = time.perf_counter()
    lib.log(value, step=step)
    times.append(time.perf_counter() - t)
t = time.perf_counter()
run.finish()
print(json.dumps({"times": times, "finish": time.perf_counter() - t}))
"""


def one(peer: str, steps: int, buckets: int) -> dict:
    env = {**os.environ, "WANDB_SILENT": "true", "RUNLEDGER_SILENT": "1"}
    env.pop("RUNLEDGER_NATS", None)
    with tempfile.TemporaryDirectory() as where:
        out = subprocess.run([sys.executable, "-c", CHILD, peer, str(steps), str(buckets), where], env=env, cwd=where,
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"{peer}: {out.stderr[-2000:]}")
        if peer == "runledger":
            from runledger.ledger import local

            local.down(Path(where) / "root")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    times = sorted(got["times"])
    return {"median": statistics.median(times), "p99": times[int(0.99 * (len(times) - 1))], "finish": got["finish"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--buckets", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    peers = {"runledger": args.buckets, "runledger-off": args.buckets, "wandb": min(args.buckets, 512)}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    got: dict[str, list[dict]] = {p: [] for p in peers}
    ratios = []
    for r in range(args.rounds):
        order = list(peers) if r % 2 == 0 else list(reversed(peers))
        this = {p: one(p, args.steps, peers[p]) for p in order}
        for p in peers:
            got[p].append(this[p])
        ratios.append(this["runledger"]["median"] / this["wandb"]["median"])
    for p, rows in got.items():
        med = {k: statistics.median(x[k] for x in rows) for k in ("median", "p99", "finish")}
        print(f"{p:14s} {peers[p]:5d} buckets  log {1e6 * med['median']:8.1f} us/step (p99 {1e6 * med['p99']:8.1f} us)"
              f"  finish {med['finish']:6.2f} s")
    print(f"runledger/wandb per-step log time, median of {args.rounds} rounds: {statistics.median(ratios):.2f} "
          f"(runledger {args.buckets} buckets, wandb {peers['wandb']})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
