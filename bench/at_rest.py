"""Bytes at rest per logged value: runledger (tables + spool + the JetStream stream) against W&B offline.

    python -m bench.at_rest [--steps N] [--only runledger,wandb] [--code DIR]

Each peer logs bench.peers' free-form run (N steps x 20 names: `runledger.log` into a fresh root on the
embedded default; `wandb.log` with wandb.init(mode="offline")) in its own process and finishes. For
runledger the root's server and ledger are then given PRUNE_WAIT_S (the ledger lets go of acked stream
messages every retention.PRUNE_EVERY_S) and stopped (`runledger nats down`), so that what stays is
what a user's disk keeps. Every file under the root (or W&B's folder) is counted by where it lies:
`tables` (Parquet and Iceberg metadata, the catalog, the chains' heads, positions, the transparency
log), `spool`, `stream` (the nats-server's JetStream store) and `other` (the supervisor's state and
log, locks; for W&B, everything in its folder). `--code DIR`: the runledger code of another
checkout (the same layout, e.g. `git archive <commit> | tar -x -C DIR`), for a before/after on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

NAMES = 20
PRUNE_WAIT_S = 5.0

RUNLEDGER = """
    import sys, time
    from bench.peers import make_freeform
    import runledger
    steps = make_freeform(int(sys.argv[1]))
    run = runledger.init(project="at-rest", id="at-rest", system_metrics=False)
    for step, values in steps:
        runledger.log(values, step=step)
    assert run.finish()
"""

WANDB = """
    import sys
    from bench.peers import make_freeform
    import wandb
    steps = make_freeform(int(sys.argv[1]))
    run = wandb.init(project="at-rest", dir=sys.argv[2], mode="offline",
                     settings=wandb.Settings(x_disable_stats=True, console="off", save_code=False, disable_git=True))
    for step, values in steps:
        run.log(values, step=step)
    run.finish()
"""

SITECUSTOMIZE = """
import os
try:
    import __editable___runledger_0_1_0_finder as finder
    base = os.environ["RUNLEDGER_BENCH_CODE"]
    finder.MAPPING.update({k: os.path.join(base, os.path.basename(v)) for k, v in finder.MAPPING.items()})
except (ImportError, KeyError):
    pass
"""


def code_env(code: Path | None, tmp: Path) -> dict:
    """The environment of a child: the runledger of `code` (the editable install's mapping moved there)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    if code is not None:
        site = tmp / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env["PYTHONPATH"] = os.pathsep.join((str(site), env["PYTHONPATH"]))
        env["RUNLEDGER_BENCH_CODE"] = str(code.resolve())
    return env


def where(path: Path, top: Path) -> str:
    parts = path.relative_to(top).parts
    if parts[0] == "spool":
        return "spool"
    if "jetstream" in parts:
        return "stream"
    if parts[0] == "local" or path.suffix == ".log" or "lock" in path.name:
        return "other"  # the supervisor's state and log, locks
    return "tables"  # the tables' data and metadata, the catalog, heads, positions, the transparency log


def sizes(top: Path) -> dict[str, int]:
    out = {"tables": 0, "spool": 0, "stream": 0, "other": 0}
    biggest: dict[str, int] = {}
    for p in top.rglob("*"):
        if p.is_file() and not p.is_symlink():
            out[where(p, top)] += p.stat().st_size
            if where(p, top) == "other":
                biggest[str(p.relative_to(top).parent)] = biggest.get(str(p.relative_to(top).parent), 0) + p.stat().st_size
    out["total"] = sum(out.values())
    out["other_in"] = dict(sorted(biggest.items(), key=lambda kv: -kv[1])[:3])
    return out


def run_runledger(steps: int, tmp: Path, env: dict) -> dict:
    root = tmp / "root"
    env = {**env, "RUNLEDGER_ROOT": str(root)}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", textwrap.dedent(RUNLEDGER), str(steps)], env=env, check=True, timeout=1800)
    logged_s = time.perf_counter() - t
    time.sleep(PRUNE_WAIT_S)
    subprocess.run([sys.executable, "-m", "runledger.tools.cli", "down", "--root", str(root)], env=env,
                   capture_output=True, timeout=120)
    return {"seconds": logged_s, **sizes(root)}


def run_wandb(steps: int, tmp: Path, env: dict) -> dict:
    folder = tmp / "wandb"
    folder.mkdir()
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", textwrap.dedent(WANDB), str(steps), str(folder)], env=env, check=True,
                   timeout=1800, capture_output=True)
    logged_s = time.perf_counter() - t
    time.sleep(2.0)  # (wandb-core's last writes)
    found = sizes(folder)
    return {"seconds": logged_s, **{k: 0 for k in ("tables", "spool", "stream")}, "other": found["total"],
            "total": found["total"], "other_in": found["other_in"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5_000)
    p.add_argument("--only", default="runledger,wandb")
    p.add_argument("--code", type=Path, help="the runledger code of another checkout (a before)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    values = args.steps * NAMES
    results = {}
    with tempfile.TemporaryDirectory(prefix="at-rest-") as d:
        tmp = Path(d)
        env = code_env(args.code, tmp)
        for name in args.only.split(","):
            (tmp / name).mkdir()
            results[name] = (run_runledger if name == "runledger" else run_wandb)(args.steps, tmp / name, env)
    print(f"{args.steps} steps x {NAMES} names = {values:,} values; code: {args.code or 'this checkout'}; {os.cpu_count()} CPUs")
    print(f"{'':10} {'tables':>10} {'spool':>10} {'stream':>10} {'other':>10} {'total':>11} {'B/value':>8}")
    for name, r in results.items():
        print(f"{name:10} " + " ".join(f"{r[k]:>10,}" for k in ("tables", "spool", "stream", "other"))
              + f" {r['total']:>11,} {r['total'] / values:>8.1f}")
    print("other: " + "; ".join(f"{name}: " + ", ".join(f"{k} {v:,}" for k, v in r["other_in"].items())
                                 for name, r in results.items()))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
