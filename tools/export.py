"""`runledger export RUN|--all --format parquet|csv --out DIR [--root ROOT] [--snapshot N]`: a run's (or every run's)
stored events to a folder other engines read (runledger.ledger.storage.export); `runledger verify --root DIR` checks
a Parquet export from its files alone (runledger.ledger.check.exported)."""

from __future__ import annotations

import argparse
import json

from runledger.tools import checks
from runledger.tools.args import RUN_HELP, UsageError, add_root


def cmd_export(args: argparse.Namespace) -> int:
    from runledger.ledger.storage import export
    from runledger.ledger.storage.paths import NotALedger, SnapshotGone

    if bool(args.run) == bool(args.all):
        raise UsageError("name one RUN, or --all")
    try:
        done = export.export(args.root, args.out, None if args.all else [args.run], args.format, args.snapshot)
    except (export.ExportRefused, NotALedger, SnapshotGone, OSError) as err:
        raise UsageError(str(err)) from None
    print(json.dumps({"out": args.out, "format": args.format, "runs": len(done.runs), "files": done.files,
                      "events": done.rows, "bytes": done.bytes, "seconds": round(done.seconds, 3)}))
    return 0


def cmd_verify_export(folder: str, fmt: str, require_signed: bool = False, trusted: set[str] | None = None,
                      attestations=None) -> int:
    """`runledger verify --root DIR` of a folder holding an export (runledger.tools.cli.cmd_verify hands it here)."""
    from runledger.ledger.check.exported import verify_export

    try:
        report = verify_export(folder, require_signed, trusted, attestations)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if fmt == "json":
        print(json.dumps({**report.summary(), "export": True}))
    else:
        print(f"export {folder}:\n{report.text()}")
    return 0 if report.ok else 1


def register(sub) -> None:
    s = sub.add_parser("export", help="a run's (or --all runs') events as Parquet (every envelope column, canonical payload) or CSV")
    s.add_argument("run", nargs="?", type=checks.run, default=None, help=RUN_HELP)
    s.add_argument("--all", action="store_true", help="every run of the root")
    add_root(s)
    s.add_argument("--format", choices=["parquet", "csv"], default="parquet")
    s.add_argument("--out", type=checks.folder, required=True, metavar="DIR", help="an empty or new folder")
    s.add_argument("--snapshot", type=checks.count, default=None, metavar="N", help="export ledger snapshot N (see `sql --snapshot`)")
    s.set_defaults(func=cmd_export)
