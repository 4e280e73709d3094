"""The `runledger` command: parses arguments and calls into ledger/, training/, agents/, queries/.

Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input (with a one-line reason).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from ledger import bus, natsserver
from ledger.events import InvalidEvent, check_name

log = logging.getLogger("runledger")


class UsageError(Exception):
    """Bad usage or bad input: exit 2 with this one-line reason."""


def default_root() -> str:
    return os.environ.get("RUNLEDGER_ROOT", "./runledger-data")


def resolve_nats(args: argparse.Namespace) -> str:
    """The server to talk to: --creds (a credentials file: URL with user and password), else --nats,
    else $RUNLEDGER_CREDS / $RUNLEDGER_NATS, else the server `nats up` started for --root, else :4222."""
    creds = getattr(args, "creds", None) or os.environ.get("RUNLEDGER_CREDS")
    if creds:
        return natsserver.read_creds(creds)
    if getattr(args, "nats", None):
        return args.nats
    if os.environ.get("RUNLEDGER_NATS"):
        return os.environ["RUNLEDGER_NATS"]
    url_file = natsserver.nats_dir(getattr(args, "root", None) or default_root()) / "url"
    if url_file.exists():
        return url_file.read_text().strip()
    return "nats://127.0.0.1:4222"


def add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=default_root(), help="ledger root directory (env RUNLEDGER_ROOT)")


def add_nats(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", default=None, help="NATS URL(s), comma-separated for a cluster (env RUNLEDGER_NATS; "
                   "default: the server `nats up` started for --root)")
    p.add_argument("--creds", default=None, help="credentials file from `nats up --secure` (env RUNLEDGER_CREDS)")


# ------------------------------------------------------------------------------------ commands


def cmd_nats(args: argparse.Namespace) -> int:
    if args.action == "up":
        try:
            url = natsserver.up(args.root, args.port, args.sync_interval, args.secure, tuple(args.runs), args.cluster)
        except ValueError as err:
            raise UsageError(str(err)) from None
        if args.cluster or args.secure:
            asyncio.run(_ensure_stream(url if not args.secure else natsserver.read_creds(
                natsserver.nats_dir(args.root) / "creds" / "ledger.creds"), args.cluster or None))
        if args.secure:
            log.info("credentials per role in %s", natsserver.nats_dir(args.root) / "creds")
        print(url)
    elif args.action == "creds":
        if not args.worker:
            raise UsageError("nats creds needs --worker RUN_ID")
        try:
            print(natsserver.add_worker(args.root, args.worker))
        except ValueError as err:
            raise UsageError(str(err)) from None
    else:
        stopped = natsserver.down(args.root)
        log.info("nats-server %s", "stopped" if stopped else "was not running")
    return 0


async def _ensure_stream(url: str, replicas: int | None, timeout: float = 60.0) -> None:
    """Create the stream now (a cluster needs a few seconds to elect a JetStream leader)."""
    import time as _time

    deadline = _time.monotonic() + timeout
    while True:
        try:
            nc = await bus.connect(url)
            try:
                await bus.ensure_stream(nc.jetstream(), replicas)
                return
            finally:
                await nc.close()
        except Exception as err:
            if _time.monotonic() > deadline:
                raise RuntimeError(f"could not create the stream on {url}: {err}") from err
            await asyncio.sleep(0.5)


def cmd_ledger_serve(args: argparse.Namespace) -> int:
    from ledger import service

    asyncio.run(service.serve(args.root, resolve_nats(args), batch=args.batch))
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from ledger.publish import publish_lines

    bad, published = asyncio.run(publish_lines(sys.stdin, resolve_nats(args)))
    for lineno, reason in bad:
        print(f"line {lineno}: {reason}", file=sys.stderr)
    log.info("published %d events, refused %d lines", published, len(bad))
    return 2 if bad else 0


def cmd_sql(args: argparse.Namespace) -> int:
    import queries

    try:
        rel = queries.query(args.root, args.sql)
    except queries.ReadOnlyViolation as err:
        raise UsageError(str(err)) from None
    except Exception as err:  # a DuckDB parse/binder error is bad input
        raise UsageError(f"SQL error: {str(err).splitlines()[0]}") from None
    write_relation(rel, args.format)
    return 0


def write_relation(rel, fmt: str) -> None:
    """Print a DuckDB relation as a table, CSV or JSON (one object per row, in a list)."""
    cols = rel.columns
    rows = rel.fetchall() if rel is not None else []
    if fmt == "json":
        print(json.dumps([dict(zip(cols, r)) for r in rows], default=str, indent=1))
    elif fmt == "csv":
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(*cols, show_lines=False)
        for r in rows:
            t.add_row(*("" if v is None else str(v) for v in r))
        Console(width=max(120, min(250, 20 * len(cols)))).print(t)


def cmd_replay(args: argparse.Namespace) -> int:
    from ledger.replay import replay_run, to_json_text

    check_name(args.run, "run_id")
    state = replay_run(args.root, args.run, args.as_of_seq)
    if state.events == 0:
        raise UsageError(f"no events for run {args.run!r} under {args.root}")
    print(to_json_text(state))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from ledger.verify import verify

    report = verify(args.root)
    print(report.text())
    return 0 if report.ok else 1


def cmd_schema(args: argparse.Namespace) -> int:
    from ledger.events import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tools.demo import run_demo

    return run_demo(Path(args.root) if args.root else None, quick=args.quick)


# ------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="runledger", description="An open, auditable ledger for model-training runs.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("demo", help="the main job, end to end on one machine")
    s.add_argument("--root", default=None, help="ledger root (default: a fresh ./runledger-demo-* directory)")
    s.add_argument("--quick", action="store_true", help="a short version (used by a test)")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("nats", help="a local JetStream server on loopback")
    s.add_argument("action", choices=["up", "down", "creds"])
    add_root(s)
    s.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    s.add_argument("--sync-interval", default=None, help="JetStream fsync interval, e.g. 'always' (default 2m)")
    s.add_argument("--secure", action="store_true", help="users per role with subject permissions, and credentials")
    s.add_argument("--runs", nargs="*", default=[], help="with --secure: runs to make worker credentials for")
    s.add_argument("--worker", default=None, help="creds: make worker credentials for this run")
    s.add_argument("--cluster", type=int, default=0, help="start this many clustered nodes (stream replicas = N)")
    s.set_defaults(func=cmd_nats)

    s = sub.add_parser("ledger", help="the ledger service")
    s.add_argument("action", choices=["serve"])
    add_root(s)
    add_nats(s)
    s.add_argument("--batch", type=int, default=2000, help="messages fetched per batch")
    s.set_defaults(func=cmd_ledger_serve)

    s = sub.add_parser("publish", help="validate JSON Lines envelopes from stdin and publish them")
    add_root(s)
    add_nats(s)
    s.set_defaults(func=cmd_publish)

    s = sub.add_parser("sql", help="read-only SQL over the ledger views")
    add_root(s)
    s.add_argument("--format", choices=["table", "csv", "json"], default="table")
    s.add_argument("sql")
    s.set_defaults(func=cmd_sql)

    s = sub.add_parser("replay", help="the run's rebuilt state as JSON")
    s.add_argument("run")
    add_root(s)
    s.add_argument("--as-of-seq", type=int, default=None, help="only events up to this stream sequence")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("verify", help="hash chains, gaps, duplicates, quarantine; exit 1 on any problem")
    add_root(s)
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("schema", help="JSON Schema of every event kind")
    s.set_defaults(func=cmd_schema)

    for module in PLUGINS:
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError as err:
            if err.name and module.startswith(err.name):
                continue  # that part is not built yet
            _register_broken(sub, module, err)
            continue
        except Exception as err:  # a broken part must not take `ledger serve` or `verify` down with it
            _register_broken(sub, module, err)
            continue
        if hasattr(mod, "register"):
            mod.register(sub)
    return p


PLUGINS = ("training.cli", "training.ladder_cli", "queries.audit", "agents.cli", "tools.report")


def _register_broken(sub, module: str, err: Exception) -> None:
    name = {"training.cli": "train", "training.ladder_cli": "ladder", "queries.audit": "audit", "agents.cli": "agents",
            "tools.report": "report"}[module]

    def fail(args: argparse.Namespace) -> int:
        raise UsageError(f"`{name}` is unavailable: {module} failed to import ({type(err).__name__}: {err})")

    s = sub.add_parser(name, help=f"(unavailable: {module} failed to import)")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=fail)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    logging.getLogger("nats").setLevel(logging.CRITICAL)  # reconnect chatter; our own logs say what matters
    try:
        return args.func(args) or 0
    except (UsageError, InvalidEvent) as err:
        print(f"runledger {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
