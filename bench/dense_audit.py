"""The one-run health audit of a dense run (every step stamped within a minute or two), with
`health/throughput_floor` as it is against as it was at a baseline commit, in one command.

    python -m bench.dense_audit [--events 200000 1000000] [--baseline REV]

For each size, one run written by `bench.verify.write_sealed_run` (the project's sealing and writer) into
a temporary root, then `run_suite(root, "health", "big")` in this process (as `runledger audit health big`
runs it, its connection over the run's files included), once with the repository's query files and once
with `queries/health/throughput_floor.sql` as `git show REV:` gives it. A throughput window of 15 minutes
holds every sample of such a run, the case where range-framed windows cost O(n x window). Shown: wall and
CPU seconds (this process's user+sys: on a shared machine wall grows with the load, CPU much less), the
check's own seconds, the slowest other check, and that both audits give the same rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECK = "health/throughput_floor"


def _audit(root: Path, run_id: str, text: str) -> dict:
    """The one-run audit with `text` as the check's query: wall and CPU seconds, per-query seconds, rows."""
    from runledger import queries
    from runledger.queries.audit import run_suite

    load = queries.load_query
    queries.load_query = lambda name: text if name == CHECK else load(name)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        audit = run_suite(root, "health", run_id)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        queries.load_query = load
    return {"wall": wall, "cpu": cpu, "seconds": {r.name: r.seconds for r in audit.results},
            "rows": {r.name: r.rows for r in audit.results}}


def main(argv: list[str] | None = None) -> int:
    from bench.verify import RUN_ID, write_sealed_run
    from runledger.queries.audit import run_suite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="+", default=[200_000, 1_000_000])
    ap.add_argument("--baseline", default="ed210f9", help="the commit whose throughput_floor.sql is the baseline")
    args = ap.parse_args(argv)
    old = subprocess.run(["git", "show", f"{args.baseline}:queries/{CHECK}.sql"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    new = (REPO / "queries" / f"{CHECK}.sql").read_text()
    lines = []
    for events in args.events:
        root = Path(tempfile.mkdtemp(prefix="bench-dense-audit-"))
        try:
            write_sealed_run(root, events)
            run_suite(root, "health", RUN_ID, only=("telemetry_silence",))  # (imports and the files' cache, for both)
            now, before = _audit(root, RUN_ID, new), _audit(root, RUN_ID, old)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        assert now["rows"][CHECK] == before["rows"][CHECK], (now["rows"][CHECK], before["rows"][CHECK])
        others = {n: s for n, s in now["seconds"].items() if n != CHECK}
        slowest = max(others, key=others.get)
        lines.append(f"{events:>9} {before['wall']:>9.2f} {before['cpu']:>8.2f} {before['seconds'][CHECK]:>9.2f}"
                     f" {now['wall']:>9.2f} {now['cpu']:>8.2f} {now['seconds'][CHECK]:>9.2f}"
                     f" {before['wall'] / now['wall']:>7.1f} {before['cpu'] / now['cpu']:>7.1f}"
                     f"  {slowest.split('/')[1]} {others[slowest]:.2f}")
        print(lines[-1], file=sys.stderr)
    print(f"one-run health audit of a dense run, in process, baseline {args.baseline}; load average "
          f"{os.getloadavg()[0]:.1f}; the same throughput_floor row from both")
    print(f"{'events':>9} {'old wall':>9} {'old cpu':>8} {'old check':>9} {'new wall':>9} {'new cpu':>8}"
          f" {'new check':>9} {'wall x':>7} {'cpu x':>7}  slowest other check (new, s)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
