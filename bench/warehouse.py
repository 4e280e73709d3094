"""A warehouse on local disk against one on S3-compatible object storage, in one command.

    python -m bench.warehouse [--events N] [--batch B]

The S3 server is OpenStack Swift with its s3api middleware on loopback (tests/support/s3.py: `make s3`
installs it), its data in tmpfs. For each warehouse, the same N step events of one run:
  ingest   the ledger's writer (`store.write_events`: one Parquet file, one Iceberg commit and the chain
           heads per batch of B events), events/s and the mean commit (write + commit) latency
  sql      `runledger sql "select count(*), count(distinct event_id) from steps_all"` as a child process,
           the median wall time of 3 (its start-up included)
  verify   `verify(root)` in this process (every file read whole, its hashes, chains and digests)
The NATS side is left out on purpose: it is the same for both (bench.ingest measures it).
"""

from __future__ import annotations

import argparse
import os
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args(argv)

    from support import s3

    from runledger.ledger.storage import objects

    rows = _events(args.events)
    work = Path(tempfile.mkdtemp(prefix="bench-warehouse-"))
    server = s3.SwiftS3().start()
    try:
        results = {"local": _one(work / "local", rows, args.batch)}
        os.environ.update(server.credentials())
        server.bucket("bench-warehouse")
        objects.use_warehouse(work / "s3", "s3://bench-warehouse/tables")
        results["s3 (Swift)"] = _one(work / "s3", rows, args.batch)
    finally:
        server.stop()
    print(f"{args.events} step events, batches of {args.batch}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'warehouse':<12} {'events/s':>10} {'commit ms':>10} {'sql s':>7} {'verify s':>9}")
    for name, r in results.items():
        print(f"{name:<12} {r['events/s']:>10.0f} {r['commit ms']:>10.0f} {r['sql s']:>7.2f} {r['verify s']:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
