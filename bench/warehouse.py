"""A warehouse on local disk against one on S3-compatible object storage, in one command.

    python -m bench.warehouse [--events N] [--batch B] [--big M]

The S3 server is OpenStack Swift with its s3api middleware on loopback (tests/support/s3.py: `make s3`
installs it), its data in tmpfs. For each warehouse, the same N step events of one run:
  ingest   the ledger's writer (`store.write_events`: one Parquet file, one Iceberg commit and the chain
           heads per batch of B events), events/s and the mean commit (write + commit) latency
  sql      `runledger sql "select count(*), count(distinct event_id) from steps_all"` as a child process,
           the median wall time of 3 (its start-up included)
  verify   `verify(root)` in this process (every file read whole, its hashes, chains and digests)
Then, for each warehouse, one big run of M events (default 1,000,000) written by `bench.verify.write_sealed_run`
(the project's sealing and writer, files of 250,000 events, compacted) and three commands as a user runs
them, each its own process, the median wall time of 3 (start-up included) and the ratio S3/local:
  audit    `runledger audit health big --root R` (the one-run audit)
  sql      `runledger sql "select count(*), max(step) from steps where run_id = 'big'"`
  verify   `runledger verify --root R`
The NATS side is left out on purpose: it is the same for both (bench.ingest measures it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # (the Swift server and the tests' event maker)


def _events(n: int):
    from support.runs import Producer, canonical, step_payload

    p = Producer()
    return [canonical(p.event("step", step_payload(float(s)), s, s + 1)) for s in range(n)]


def _one(root: Path, rows: list, batch: int) -> dict:
    from runledger.ledger.check.verify import verify
    from runledger.ledger.storage import store

    commits = []
    t0 = time.perf_counter()
    for i in range(0, len(rows), batch):
        t = time.perf_counter()
        store.write_events(root, rows[i:i + batch])
        commits.append(time.perf_counter() - t)
    ingest = time.perf_counter() - t0
    sql = []
    for _ in range(3):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "sql", "--root", str(root), "--format", "csv",
                              "select count(*), count(distinct event_id) from steps_all"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        sql.append(time.perf_counter() - t)
        assert out.returncode == 0 and out.stdout.splitlines()[1] == f"{len(rows)},{len(rows)}", out.stderr
    t = time.perf_counter()
    report = verify(root)
    verify_s = time.perf_counter() - t
    assert report.ok and report.events == len(rows), report
    return {"events/s": len(rows) / ingest, "commit ms": 1000 * statistics.mean(commits),
            "sql s": statistics.median(sql), "verify s": verify_s}


BIG_COMMANDS = ("audit", "sql", "verify")


def _run_cli(argv: list[str], times: int = 3, tries: int = 6) -> tuple[float, int]:
    """The median wall seconds of `times` runs of `runledger ARGV`, each its own process, and how many
    runs failed on the way (at most `tries` in all: a failure is counted and shown, not hidden). The
    audit exits 1 when a check fails: a result all the same."""
    ok = {0, 1} if argv[0] == "audit" else {0}
    walls, failed = [], 0
    while len(walls) < times and len(walls) + failed < tries:
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "runledger.tools.cli", *argv], cwd=REPO, capture_output=True,
                             text=True, timeout=1800)
        wall = time.perf_counter() - t
        if out.returncode in ok:
            walls.append(wall)
        else:
            failed += 1
            print(f"runledger {argv[0]} failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1][:300]}",
                  file=sys.stderr)
    assert walls, f"runledger {argv[0]}: every run failed"
    return statistics.median(walls), failed


def _big(root: Path, events: int, only: list[str]) -> dict:
    """Write one run of `events` into `root`'s warehouse, then time the audit, sql and verify (median of 3)."""
    from bench.verify import RUN_ID, write_sealed_run

    t = time.perf_counter()
    write_sealed_run(root, events)
    result = {"write s": time.perf_counter() - t, "failed": {}}
    print(f"{root.name}: {events} events written in {result['write s']:.0f} s", file=sys.stderr)
    commands = {"audit": ["audit", "health", RUN_ID, "--root", str(root), "--format", "json"],
                "sql": ["sql", "--root", str(root), "--format", "csv",
                        f"select count(*), max(step) from steps where run_id = '{RUN_ID}'"],
                "verify": ["verify", "--root", str(root)]}
    out = subprocess.run([sys.executable, "-m", "runledger.tools.cli", *commands["sql"]], cwd=REPO,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr
    result["sql answer"] = out.stdout.splitlines()[1]  # (the same on both warehouses: main checks)
    for name in only:
        argv = commands[name]
        result[name + " s"], result["failed"][name] = _run_cli(argv)
        print(f"{root.name}: {name} {result[name + ' s']:.2f} s", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--big", type=int, default=1_000_000, help="events of the one run the audit, sql and verify read (0: none)")
    ap.add_argument("--commands", nargs="+", choices=BIG_COMMANDS, default=list(BIG_COMMANDS),
                    help="which of the big run's commands to time (the audit of a dense synthetic run is slow: RESULTS.md)")
    args = ap.parse_args(argv)

    from support import s3

    from runledger.ledger.storage import objects

    rows = _events(args.events)
    work = Path(tempfile.mkdtemp(prefix="bench-warehouse-"))
    server = s3.SwiftS3().start()
    try:
        results = {"local": _one(work / "local", rows, args.batch)}
        big = {"local": _big(work / "local-big", args.big, args.commands)} if args.big else {}
        os.environ.update(server.credentials())
        server.bucket("bench-warehouse")
        objects.use_warehouse(work / "s3", "s3://bench-warehouse/tables")
        results["s3 (Swift)"] = _one(work / "s3", rows, args.batch)
        if args.big:
            objects.use_warehouse(work / "s3-big", "s3://bench-warehouse/big")
            big["s3 (Swift)"] = _big(work / "s3-big", args.big, args.commands)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)  # (a 1M-event root is hundreds of MB)
    print(f"{args.events} step events, batches of {args.batch}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'warehouse':<12} {'events/s':>10} {'commit ms':>10} {'sql s':>7} {'verify s':>9}")
    for name, r in results.items():
        print(f"{name:<12} {r['events/s']:>10.0f} {r['commit ms']:>10.0f} {r['sql s']:>7.2f} {r['verify s']:>9.2f}")
    if big:
        _print_big(big, args.big)
    return 0


def _print_big(big: dict, events: int) -> None:
    names = [n for n in BIG_COMMANDS if n + " s" in next(iter(big.values()))]
    print(f"\none run of {events} events, each command its own process, median of 3 (s); load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'warehouse':<12} {'write s':>8}" + "".join(f" {n + ' s':>9}" for n in names))
    for name, r in big.items():
        print(f"{name:<12} {r['write s']:>8.1f}" + "".join(f" {r[n + ' s']:>9.2f}" for n in names))
    failed = {name: {k: n for k, n in r["failed"].items() if n} for name, r in big.items()}
    if any(failed.values()):
        print(f"runs that failed (and were run again): {failed}")
    if len(big) == 2:
        local, s3 = big.values()
        assert local["sql answer"] == s3["sql answer"], (local["sql answer"], s3["sql answer"])
        print(f"{'S3/local':<12} {s3['write s'] / local['write s']:>8.1f}"
              + "".join(f" {s3[n + ' s'] / local[n + ' s']:>9.1f}" for n in names))

if __name__ == "__main__":
    raise SystemExit(main())
