"""DuckDB's reads of an S3 warehouse, again and again: do any fail, and what does a read cost?

    python -m bench.s3_reads [--rounds N] [--events M]

One run of M events (default 20,000; `bench.verify.write_sealed_run`) in a bucket of OpenStack Swift on
loopback (tests/support/s3.py; `make s3` installs it), then N rounds of the two readers a user runs, each
its own process: `runledger audit health big` (the one-run audit) and `runledger sql` over the run's steps.
It prints each command's failures (with their last line) and the median wall time of `sql`, and exits 1 if
any failed. Before `objects.duckdb_filesystem` gave each DuckDB thread its own position in a file, 5 of 35
audits failed this way ("Out of buffer", "Failed to read N bytes", a Snappy size mismatch) at load 3-11.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # (the Swift server)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.s3_reads", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--events", type=int, default=20_000)
    args = p.parse_args(argv)

    from support import s3

    from bench.verify import RUN_ID, write_sealed_run
    from runledger.ledger.storage import objects

    work = Path(tempfile.mkdtemp(prefix="bench-s3-reads-"))
    server = s3.SwiftS3().start()
    try:
        os.environ.update(server.credentials())
        server.bucket("reads")
        root = work / "root"
        objects.use_warehouse(root, "s3://reads/tables")
        write_sealed_run(root, args.events)
        commands = {"audit": ["audit", "health", RUN_ID, "--root", str(root), "--format", "json"],
                    "sql": ["sql", "--root", str(root), "--format", "csv",
                            f"select count(*), max(step), sum(loss) from steps_all where run_id = '{RUN_ID}'"]}
        failed, errors, answers, sql_s = collections.Counter(), collections.Counter(), collections.Counter(), []
        for i in range(args.rounds):
            for name, cmd in commands.items():
                t = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "runledger.tools.cli", *cmd], cwd=REPO,
                                      capture_output=True, text=True)
                if done.returncode not in ((0, 1) if name == "audit" else (0,)):  # (an audit's 1: a check failed)
                    failed[name] += 1
                    errors[(done.stderr.strip().splitlines() or ["?"])[-1][:160]] += 1
                elif name == "sql":
                    sql_s.append(time.perf_counter() - t)
                    answers[done.stdout.strip().replace("\n", " | ")] += 1
            print(f"round {i + 1}: failed {dict(failed) or 0} (load {os.getloadavg()[0]:.1f})", flush=True)
        print(f"{args.rounds} rounds over {args.events} events: audit failed {failed['audit']}, sql failed "
              f"{failed['sql']}; sql median {statistics.median(sql_s):.2f} s" if sql_s else "no sql succeeded")
        for line, n in errors.items():
            print(f"  {n} x {line}")
        print(f"sql answers: {dict(answers)}")
        return 1 if failed else 0
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
