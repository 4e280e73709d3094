"""`runledger status`: per partition of the ledger, its writer, its lag (stream vs stored) and its last commit."""

from __future__ import annotations

import argparse
import json
import time

from runledger.tools.args import add_nats, add_root, resolve_nats


def cmd_status(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from runledger.ledger.ingest import partitions
    from runledger.ledger.storage import paths

    paths.check_root(Path(args.root))  # (a folder that is not a ledger: one line, exit 2)
    doc = asyncio.run(partitions.figures(args.root, resolve_nats(args)))
    if args.format == "json":
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{doc['root']}: {doc['partitions_total']} partition(s)"
                        + ("" if doc["live"] else " (NATS did not answer: as last recorded)"))
    for col in ("partition", "writer", "lag (msgs)", "stored up to", "last commit", "snapshot", "takeovers", "longest gap"):
        table.add_column(col)
    for r in doc["partitions"]:
        commit = r["last_commit"] or ["-", "-"]
        gap = "-" if r["longest_gap_s"] is None else f"{r['longest_gap_s']:.2f} s"
        table.add_row(str(r["partition"]), r["writer"] or "(none)", "-" if r["pending"] is None else str(r["pending"]),
                      str(r["position"]), str(commit[0]), str(commit[1]), str(r["takeovers"]), gap)
    Console(width=160).print(table)
    stale = [r["partition"] for r in doc["partitions"] if r["renewed"] and time.time() - r["renewed"] > 10]
    if stale and not doc["live"]:
        print(f"records of partitions {stale} are over 10 s old")
    return 0


def register(sub) -> None:
    s = sub.add_parser("status", help="per partition: its writer, its lag (stream vs stored), its last commit")
    add_root(s)
    add_nats(s)
    s.add_argument("--format", choices=["table", "json"], default="table")
    s.set_defaults(func=cmd_status)
