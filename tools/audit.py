"""`runledger audit {health,provenance,forecast,fork} RUN --root DIR [--format table|json|csv]`: the audit
suites of `runledger.queries.audit` for one run; health and fork exit 1 when any check fails.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from runledger.tools import checks
from runledger.tools.args import RUN_HELP, add_root

log = logging.getLogger(__name__)


def cmd_audit(args: argparse.Namespace) -> int:
    import duckdb  # (here: the other commands never load DuckDB)

    from runledger.queries.audit import SUITES, format_audit, known_runs, run_suite

    if args.suite not in SUITES:
        print(f"runledger audit: no suite {checks.shown(args.suite)}: one of {', '.join(SUITES)}", file=sys.stderr)
        return 2
    root = Path(args.root)
    if args.run not in known_runs(root):
        print(f"runledger audit: no events for run {args.run!r} under {root}", file=sys.stderr)
        return 2
    try:
        audit = run_suite(root, args.suite, args.run)
    except duckdb.Error as err:  # a stored file that is not Parquet, say
        print(f"runledger audit: cannot read the ledger under {root}: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    sys.stdout.write(format_audit(audit, args.format))
    if audit.failed:
        failed = sorted({d["check"] for d in audit.rows() if d["status"] == "fail"})
        log.warning("run %s failed: %s", args.run, ", ".join(failed))
        return 1
    return 0


def register(subparsers) -> None:
    """Add `audit {health,provenance,forecast,fork} RUN --root DIR [--format ...]` to the runledger CLI."""
    p = subparsers.add_parser("audit", help="the audits: health checklist, provenance, forecast vs actual, a fork vs its parent")
    p.add_argument("suite", metavar="SUITE", help="health, provenance, forecast or fork (runledger.queries.audit.SUITES)")
    p.add_argument("run", type=checks.run, help=RUN_HELP)
    add_root(p)
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")
    p.set_defaults(func=cmd_audit)
