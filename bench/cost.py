"""What a user pays before the first number is logged or the first answer printed: `import runledger` against
`import trackio` and `import wandb`, and `runledger sql` against a bare DuckDB script on the same Parquet files
(issue 39, item 3), in one command.

    python -m bench.cost [--rounds N] [--only import,sql] [--steps N] [--code DIR]

import  each of `python -c "import runledger"`, `"import trackio"`, `"import wandb"` and, beside them,
        `"import runledger.core"` (what the first `runledger.init` loads before it starts: the run's classes, the
        emitter, nats-py and pydantic) and a whole offline run (`init(mode="offline")`, one `log`, `finish`: the
        client's part of a first run, no server) in a fresh process, from a folder outside the repository. Each round
        runs every one once, in an order that rotates from round to round (paired runs: a round's ratios
        compare processes started moments apart); wall and CPU (the child's user + system time, from
        `os.wait4`) per process, the median over rounds, and the median of each round's ratio to the peer.
sql     a root of one run of N steps x 20 names (written by the ledger's own writer, `ParquetSink`), and per
        query, in each round: `runledger sql --root R --format F "<query>"` (F: table, the default, and csv)
        and the bare script `python -c "import duckdb; print(duckdb.sql(<the same question over
        read_parquet of the same files>).fetchall())"`, one after the other (the order rotating); the
        child's CPU time (user + system) and wall; each answer is checked to be the bare script's.

`--code DIR`: the runledger code of another checkout (`git archive <commit> | tar -x -C DIR`), for a before
and after on one machine (see bench.at_rest). Ratios below 1: runledger is cheaper. Load average printed
before and after: the machine's other work moves absolute figures, the paired ratios much less.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.at_rest import code_env

NAMES = ["train/loss", "train/lr", "train/grad_norm"] + [f"layer_{i}/norm" for i in range(17)]  # 20 names a step
IMPORTS = {"runledger": "import runledger", "runledger.core": "import runledger.core",
           "init+log offline": ("import runledger; run = runledger.init(project='cost', root='offline-root', mode='offline', "
                                "system_metrics=False); runledger.log({'loss': 1.0}); run.finish()"),
           "trackio": "import trackio", "wandb": "import wandb"}


def run_child(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the child: user + system, its stdout) of one fresh process; reaped with os.wait4 so that
    its own CPU time is read (its output goes to files: no pipe to drain meanwhile)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - start
        p.returncode = os.waitstatus_to_exitcode(status)  # (reaped here: Popen must not wait for it again)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)[:200]} failed: {err.read().decode()[-2000:]}")
        return wall, usage.ru_utime + usage.ru_stime, out.read().decode()


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def installed(module: str, env: dict, cwd: Path) -> bool:
    r = subprocess.run([sys.executable, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"],
                       env=env, cwd=cwd, capture_output=True)
    return r.returncode == 0


def bench_import(rounds: int, env: dict, cwd: Path) -> None:
    names = [n for n in IMPORTS if n not in ("trackio", "wandb") or installed(n, env, cwd)]
    missing = sorted(set(IMPORTS) - set(names))
    if missing:
        print(f"(not installed, left out: {', '.join(missing)}; pip install -e '.[peers]')")
    for name in names:  # once each first: bytecode caches written, the page cache warm, for every one alike
        run_child([sys.executable, "-c", IMPORTS[name]], env, cwd)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            w, c, _ = run_child([sys.executable, "-c", IMPORTS[name]], env, cwd)
            wall[name].append(w)
            cpu[name].append(c)
    print(f"\n`python -c \"import X\"`, a fresh process each, {rounds} rounds (median; the ratios: median of each round's)")
    print(f"{'import':<16} {'wall s':>8} {'CPU s':>8}   " + "   ".join(f"{'/' + p + ' wall':>14} {'CPU':>6}"
                                                            for p in ("trackio", "wandb") if p in names))
    for name in names:
        ratios = []
        for peer in ("trackio", "wandb"):
            if peer in names:
                rw = median([a / b for a, b in zip(wall[name], wall[peer])])
                rc = median([a / b for a, b in zip(cpu[name], cpu[peer])])
                ratios.append(f"{rw:>14.3f} {rc:>6.3f}")
        print(f"{name:<16} {median(wall[name]):>8.3f} {median(cpu[name]):>8.3f}   " + "   ".join(ratios))


def make_root(root: Path, steps: int) -> None:
    from runledger.ledger.emit.sink import ParquetSink

    rng = random.Random(39)
    with ParquetSink(root, "cost") as sink:
        sink.emit_dict("run_started", {"config": {"lr": 1e-3}, "project": "cost", "config_hash": "0" * 64, "tags": [],
                                       "hardware": {}, "heartbeat_s": 30}, None)
        for step in range(steps):
            sink.emit_dict("metrics", {"metrics": {n: rng.random() for n in NAMES}}, step)
        sink.emit_dict("run_finished", {"status": "completed", "summary": {}}, steps - 1)


def bare_script(sql: str) -> str:
    return f"import duckdb; print(duckdb.sql({sql!r}).fetchall())"


def answer_of(out: str, fmt: str) -> list:
    """The rows a child printed, as text (runledger sql's CSV and table, the bare script's list of tuples)."""
    if fmt == "bare":
        return [["" if v is None else str(v) for v in row] for row in eval(out)]  # noqa: S307 (our own child's repr of its rows)
    if fmt == "csv":
        return list(csv.reader(io.StringIO(out)))[1:]
    return [[c.strip() for c in line.strip("│").split("│")] for line in out.splitlines() if line.startswith("│")]


def bench_sql(rounds: int, steps: int, env: dict, cwd: Path) -> None:
    root = cwd / "root"
    make_root(root, steps)
    metrics = sorted(str(p) for p in (root / "events" / "kind=metrics").rglob("*.parquet"))
    finished = sorted(str(p) for p in (root / "events" / "kind=run_finished").rglob("*.parquet"))
    queries = {  # name: (runledger's query, the bare script's query over the same files)
        "one metric's max": ("select max(value) from metrics where key = 'train/loss'",
                             f"select max(\"metrics/train/loss\") from read_parquet({metrics})"),
        "steps per run": ("select run_id, count(*) from metrics_wide group by run_id",
                          f"select run_id, count(*) from read_parquet({metrics}) group by run_id"),
        "a run's status": ("select run_id, status, final_step from runs_finished",
                           f"select run_id, status, final_step from read_parquet({finished})"),
    }
    runledger = [str(Path(sys.executable).parent / "runledger"), "sql", "--root", str(root)]  # (the console script)
    print(f"\n`runledger sql` against the bare DuckDB script, a root of {steps} steps x {len(NAMES)} names, {rounds} rounds "
          f"(CPU: the child's user + system; median; the ratio: median of each round's)")
    print(f"{'query':<18} {'format':<6} {'CPU s':>7} {'bare CPU s':>10} {'CPU ratio':>9} {'wall s':>7} {'bare wall':>9} {'ratio':>6}")
    for name, (ours, bare) in queries.items():
        cmds = {"table": runledger + [ours], "csv": runledger + ["--format", "csv", ours],
                "bare": [sys.executable, "-c", bare_script(bare)]}
        want = None
        for fmt, cmd in cmds.items():  # once each first, and the answers compared
            got = answer_of(run_child(cmd, env, cwd)[2], fmt)
            want = got if want is None else want
            assert got == want, (name, fmt, got[:3], want[:3])
        cpu: dict[str, list[float]] = {f: [] for f in cmds}
        wall: dict[str, list[float]] = {f: [] for f in cmds}
        order = list(cmds)
        for r in range(rounds):
            for fmt in order[r % 3:] + order[:r % 3]:
                w, c, _ = run_child(cmds[fmt], env, cwd)
                cpu[fmt].append(c)
                wall[fmt].append(w)
        for fmt in ("table", "csv"):
            print(f"{name:<18} {fmt:<6} {median(cpu[fmt]):>7.3f} {median(cpu['bare']):>10.3f} "
                  f"{median([a / b for a, b in zip(cpu[fmt], cpu['bare'])]):>9.3f} {median(wall[fmt]):>7.3f} "
                  f"{median(wall['bare']):>9.3f} {median([a / b for a, b in zip(wall[fmt], wall['bare'])]):>6.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="import,sql")
    p.add_argument("--steps", type=int, default=2000, help="steps of the sql root's run")
    p.add_argument("--code", type=Path, default=None, help="the runledger code of another checkout (a before/after)")
    args = p.parse_args()
    only = set(args.only.split(","))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; python {sys.version.split()[0]}"
          + (f"; code: {args.code}" if args.code else ""))
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as tmp:
        tmp = Path(tmp)
        env = code_env(args.code, tmp) if args.code else {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        if "import" in only:
            bench_import(args.rounds, env, tmp)
        if "sql" in only:
            bench_sql(args.rounds, args.steps, env, tmp)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
