"""The `runledger` command: parses arguments and calls into ledger/, training/, agents/, queries/.

Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input (with a one-line reason).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from runledger.ledger import redact, settings
from runledger.ledger.storage.paths import NotALedger, SnapshotGone
from runledger.ledger.storing import say_still_storing
from runledger.tools import checks
from runledger.tools.args import (RUN_HELP, UsageError, add_nats, add_root, add_signed_args, attestations, producer_keys, resolve_nats,
                                  warn_secrets)

log = logging.getLogger("runledger")

MAX_CLUSTER = 5  # JetStream keeps at most 5 replicas of a stream
MAX_BATCH = 100_000  # messages a ledger fetches at once (each up to runledger.ledger.contract.events.MAX_EVENT_BYTES)
MAX_PARTITIONS = 256  # ledger instances of one root, one lease and one consumer each
MAX_JOBS = 256  # processes verify starts
_SYNC_INTERVAL = re.compile(r"^(always|[1-9][0-9]{0,5}(ms|s|m|h))$")


def sync_interval(text: str) -> str:
    """nats-server's JetStream sync_interval: 'always' or a duration such as 10s, 2m."""
    if not _SYNC_INTERVAL.fullmatch(text):
        raise checks.Bad(f"{checks.shown(text)} is not 'always' or a duration such as 500ms, 10s, 2m")
    return text


# ------------------------------------------------------------------------------------ commands


def cmd_nats(args: argparse.Namespace) -> int:
    import asyncio

    from runledger.ledger.bus import natsserver

    if args.action == "up":
        try:
            url = natsserver.up(args.root, args.port, args.sync_interval, args.secure, tuple(args.runs), args.cluster)
        except (ValueError, RuntimeError, FileNotFoundError) as err:  # RuntimeError: the server exited (port in use)
            raise UsageError(str(err)) from None
        if args.cluster or args.secure:
            asyncio.run(_ensure_stream(url if not args.secure else settings.read_creds(
                settings.creds_file(args.root, "ledger")), args.cluster or None))
        if args.secure:
            log.info("credentials per role in %s", settings.creds_dir(args.root))
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


def cmd_down(args: argparse.Namespace) -> int:
    from runledger.ledger import local

    stopped = local.down(args.root)
    log.info("the local server and ledger of %s %s", args.root, "stopped" if stopped else "were not running")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Send what the root's spool holds unsent (an offline run's events, a killed producer's) to the
    server: --nats/$RUNLEDGER_NATS/--creds, else the root's embedded one (started if need be)."""
    from runledger.ledger import local
    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.emit.emitter import leftover_chains, send_leftovers

    remote = args.nats or args.creds or os.environ.get(settings.NATS_ENV) or os.environ.get(settings.CREDS_ENV)
    spool = settings.spool_dir(args.root)
    chains = leftover_chains(spool, args.run)
    if not chains:
        print(f"nothing to send in {spool}")
        return 0
    attachment = None if remote else local.attach(args.root)
    url = resolve_nats(args) if remote else attachment.url
    try:
        if remote and not bus.reachable(url):
            raise UsageError(f"nothing answers at {redact.redact(url)}: the spool is kept as it is")
        sent = send_leftovers(spool, url, args.run)
    finally:
        if attachment is not None:
            attachment.release()
    left = leftover_chains(spool, args.run)
    print(f"sent {sent} events of {len(chains)} chains from {spool}" + (f"; {len(left)} chains still unsent" if left else ""))
    return 1 if left else 0


async def _ensure_stream(url: str, replicas: int | None, timeout: float = 60.0) -> None:
    """Create the stream now (a cluster needs a few seconds to elect a JetStream leader)."""
    import asyncio
    import time as _time

    from runledger.ledger.bus import jetstream as bus

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


def _use_tsa(args: argparse.Namespace) -> None:
    """`--tsa`/`--tsa-certs` as the environment the transparency log reads (runledger.ledger.tlog.timestamps),
    so a partition's ledger, started from this one, reads them too."""
    from runledger.ledger.tlog import timestamps

    if getattr(args, "tsa", None):
        if not args.tsa.startswith(("http://", "https://")):
            raise UsageError(f"--tsa is an http(s) URL (RFC 3161 over HTTP), not {args.tsa[:80]!r}")
        os.environ[timestamps.TSA_ENV] = args.tsa
    if getattr(args, "tsa_certs", None):
        os.environ[timestamps.TSA_CERTS_ENV] = str(Path(args.tsa_certs).resolve())


def cmd_ledger_serve(args: argparse.Namespace) -> int:
    import asyncio

    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.storage import locks
    from runledger.ledger.ingest import service

    if args.catalog_file:
        args.catalog = settings.read_creds(args.catalog_file)
    _use_tsa(args)
    try:
        if args.action != "adopt-stream" and (getattr(args, "warehouse", None) or getattr(args, "s3_credentials", None)):
            from runledger.ledger.storage import objects

            named = objects.warehouse_of(args.root)
            warehouse = args.warehouse or (named or {}).get("warehouse")
            if not warehouse:
                raise UsageError("--s3-credentials is for a warehouse on object storage: give --warehouse s3://bucket/prefix")
            try:
                objects.use_warehouse(args.root, warehouse, args.s3_credentials)
            except (ValueError, OSError) as err:
                raise UsageError(str(err)) from None
        if args.action == "adopt-stream":
            from runledger.ledger.ingest.adoption import adopt_command

            print(asyncio.run(adopt_command(args.root, resolve_nats(args))))
        elif args.partitions > 1:
            from runledger.ledger.ingest import partitions

            asyncio.run(partitions.serve(args.root, resolve_nats(args), args.partitions, batch=args.batch,
                                         catalog=args.catalog))
        else:
            from runledger.ledger.ingest import partitions

            async def serve_one():
                stop = service.stopped_by_signals()  # (first: a SIGTERM while the root opens stops it cleanly)
                catalog = args.catalog or partitions.catalog_of(args.root)  # (a root's shared catalog stays its own)
                if catalog:
                    partitions.use_catalog(args.root, catalog)
                await service.serve(args.root, resolve_nats(args), stop, batch=args.batch, durable=args.durable)

            asyncio.run(serve_one())
    except (locks.Busy, bus.ConsumerTaken, NotALedger, service.StreamLost) as err:
        raise UsageError(str(err)) from None
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    import asyncio

    from runledger.ledger.push import push, shown

    if not args.source.is_dir():
        raise UsageError(f"{args.source} is not a folder")
    try:
        done = asyncio.run(push(args.source, resolve_nats(args)))
    except RuntimeError as err:
        raise UsageError(str(err)) from None
    for line in done.unreadable:
        log.warning("%s", line)
    for chain, why in sorted(done.refused.items()):
        print(f"refused chain {shown(chain)}: {why}", file=sys.stderr)
    print(f"pushed {done.sent} events; {done.chains} chains stored on the receiver, {len(done.refused)} refused")
    return 1 if done.refused else 0


def cmd_publish(args: argparse.Namespace) -> int:
    import asyncio

    from runledger.ledger.emit.publish import publish_lines

    bad, published = asyncio.run(publish_lines(sys.stdin, resolve_nats(args)))
    for lineno, reason in bad:
        print(f"line {lineno}: {reason}", file=sys.stderr)
    log.info("published %d events, refused %d lines", published, len(bad))
    return 2 if bad else 0


TABLE_ROWS = 10_000  # rows `runledger sql` draws as a table by default (CSV and JSON: queries.MAX_ROWS)


def cmd_sql(args: argparse.Namespace) -> int:
    import duckdb

    from runledger import queries

    if not 0 <= args.timeout < float("inf"):
        raise UsageError(f"--timeout {args.timeout:g} is not a number of seconds >= 0 (0: no limit)")
    max_rows = args.max_rows if args.max_rows is not None else TABLE_ROWS if args.format == "table" else queries.MAX_ROWS
    if max_rows < 0:
        raise UsageError(f"--max-rows {max_rows} is not a number of rows >= 0 (0: no limit)")
    try:  # the rows are fetched in here too: a query fails at run time as often as at parse time
        cols, rows = queries.query(args.root, args.sql, args.timeout, args.memory_limit, snapshot=args.snapshot,
                                   max_rows=max_rows or None)
    except (queries.ReadOnlyViolation, queries.QueryTimeout, ValueError, SnapshotGone) as err:
        raise UsageError(str(err)) from None
    except duckdb.Error as err:  # parse, binder, conversion, out of memory: bad input
        raise UsageError(f"SQL error: {str(err).splitlines()[0]}") from None
    write_rows(cols, rows, args.format)
    if rows.truncated:
        print(f"runledger sql: truncated at {len(rows)} rows (the bound of {rows.why}; --max-rows N to change it, "
              "0: no limit)", file=sys.stderr)
    return 0


def write_rows(cols: list[str], rows: list[tuple], fmt: str) -> None:
    """Print a query's rows as a table, CSV or JSON (one object per row, in a list)."""
    if fmt == "json":
        print(json.dumps([dict(zip(cols, r)) for r in rows], default=str, indent=1))
    elif fmt == "csv":
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    else:
        # stored text is anyone's: printed as it is (never read as markup), with its control characters
        # written as escapes (an ESC would reach the terminal)
        cells = [[visible(c) for c in cols]] + [["" if v is None else visible(str(v)) for v in r] for r in rows]
        width = max(120, min(250, 20 * len(cols)))
        drawn = plain_table(cells, width) if plain_output() else None
        if drawn is not None:
            sys.stdout.write(drawn)
            return
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(show_lines=False)
        for c in cells[0]:
            t.add_column(Text(c))
        for r in cells[1:]:
            t.add_row(*(Text(v) for v in r))
        Console(width=width).print(t)


def plain_output() -> bool:
    """Whether rich would print to stdout without styles or substitutions: not a terminal (nor forced to act
    as one), UTF-8, no notebook."""
    isatty = getattr(sys.stdout, "isatty", None)
    encoding = (getattr(sys.stdout, "encoding", "utf-8") or "utf-8").lower()
    return (not (isatty and isatty()) and encoding.startswith("utf") and "IPython" not in sys.modules
            and not {"FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"} & set(os.environ))


def plain_table(cells: list[list[str]], width: int) -> str | None:
    """rich's Table as `write_rows` makes it (heavy head, a cell's padding 1), drawn without importing rich (most of
    a small query's start), where it is the same text: printable ASCII (a character a cell), a header, and a
    table `width` holds with no cell wrapped or cut; else None (rich draws it). tests/unit/test_cli.py holds the
    two to the same output."""
    if not cells[0] or not all(v.isascii() and v.isprintable() for row in cells for v in row):
        return None
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    if sum(widths) + 3 * len(widths) + 1 > width:
        return None

    def line(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right + "\n"

    def row(bar: str, values: list[str]) -> str:
        return bar + bar.join(f" {v.ljust(w)} " for v, w in zip(values, widths)) + bar + "\n"

    return "".join([line("┏", "━", "┳", "┓"), row("┃", cells[0]), line("┡", "━", "╇", "┩"),
                    *(row("│", r) for r in cells[1:]), line("└", "─", "┴", "┘")])


_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """`text` with control characters (C0, DEL, C1) and bidirectional controls as escapes, e.g. \\x1b."""
    return _INVISIBLE.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(err: Exception) -> str:
    """An error's reason as one line for stderr: control characters (a newline in a path) escaped, and
    the password of any URL in it written as ***."""
    return visible(redact.redact(str(err)))


def cmd_replay(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from runledger.ledger.check.replay import replay_run, to_json_text
    from runledger.ledger.contract.validation import check_name

    check_name(args.run, "run_id")
    started = time.monotonic()
    try:
        with _spinner(f"replaying {args.run}"):
            state = replay_run(args.root, args.run, args.as_of_seq, args.snapshot)
    except (pa.ArrowException, OSError) as err:  # a file that is not Parquet, or not readable
        raise UsageError(f"cannot read the ledger under {args.root}: {str(err).splitlines()[0]}") from None
    except SnapshotGone as err:
        raise UsageError(str(err)) from None
    if state.events == 0:
        raise UsageError(f"no events for run {args.run!r} under {args.root}")
    if args.format == "json":  # one line: what was folded, how fast, and the state
        seconds = time.monotonic() - started
        print(json.dumps({"run_id": args.run, "events": state.events, "seconds": round(seconds, 3),
                          "events_per_s": round(state.events / max(seconds, 1e-9)), "state": state.to_json()}))
    else:
        print(to_json_text(state))
    return 0


@contextlib.contextmanager
def _spinner(what: str):
    """A spinner on stderr while `what` runs, on a terminal only."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(what):
        yield


@contextlib.contextmanager
def _progress_bar(what: str):
    """A progress bar on stderr, on a terminal only; yields the callback that moves it (or None)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def cmd_verify(args: argparse.Namespace) -> int:
    from runledger.ledger.check import workers
    from runledger.ledger.storage.export import is_export

    if is_export(args.root):  # an export (`runledger export`): checked from its own files
        from runledger.tools.export import cmd_verify_export

        return cmd_verify_export(args.root, args.format, args.require_signed, producer_keys(args.producer_keys),
                                 attestations(args.attest_key))

    if not args.since:  # (--since checks only what is new: too little to guess from the root's size)
        workers.start_early(args.root, args.jobs)  # (its imports then run beside this process's next ones)
    from runledger.ledger.storage import locks
    from runledger.ledger.check import verified
    from runledger.ledger.check.verify import repair, verify

    since = None
    if args.since:
        try:
            since = verified.read(args.since)
        except FileNotFoundError:
            raise UsageError(f"no verify record at {args.since}: make one with `runledger verify --record "
                             f"{args.since}`") from None
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read the verify record {args.since}: {err}") from None
    if args.repair:
        try:
            removed, left = repair(args.root)
        except locks.Busy as err:
            raise UsageError(f"{err}; stop it before --repair") from None
        except ValueError as err:  # a file changed since the ledger wrote it: verify says which, repair won't launder it
            raise UsageError(str(err)) from None
        for eid, n in sorted(removed.items()):
            print(f"repaired: {eid}: removed {n} identical extra cop{'y' if n == 1 else 'ies'}")
        for eid in left:
            print(f"not repaired: {eid}: stored more than once with different content")
        print(f"removed {sum(removed.values())} duplicate rows of {len(removed)} events")
    if args.assume_unchanged and not args.since:
        raise UsageError("--assume-unchanged goes with --since FILE (the files it assumes unchanged are FILE's)")
    record_to = args.record or args.since
    trusted = producer_keys(args.producer_keys)
    started = time.monotonic()
    with _progress_bar("verifying (rows checked + chains walked)") as progress:
        try:
            report = verify(args.root, since=since, jobs=args.jobs, progress=progress, record=record_to is not None,
                            snapshot=args.snapshot, assume_unchanged=args.assume_unchanged,
                            require_signed=args.require_signed, trusted=trusted, attestations=attestations(args.attest_key))
        except SnapshotGone as err:
            raise UsageError(str(err)) from None
    seconds = time.monotonic() - started
    if report.record is not None and record_to:
        verified.write(record_to, report.record)
    if args.format == "json":  # one line: the summary, the problems and the chain heads (for publishing)
        print(json.dumps({**report.summary(), "seconds": round(seconds, 3),
                          "events_per_s": round(report.checked / max(seconds, 1e-9))}))
    else:
        print(report.text())
    return 0 if report.ok else 1


def resolve_run_arg(args: argparse.Namespace) -> None:
    """A command's RUN given as a name becomes its run's id (`runledger.queries.names.resolve_run`: an id
    wins; a name several runs have is refused, listing them); one that names no run stays as given,
    for the command to say so, unless it cannot be an id either."""
    given = getattr(args, "run", None)
    if not isinstance(given, str) or not Path(args.root).is_dir():
        return
    from runledger.ledger.contract.events import NAME_RE
    from runledger.queries.names import AmbiguousRun, resolve_run

    try:
        args.run = resolve_run(args.root, given)
    except AmbiguousRun as err:
        raise UsageError(str(err)) from None
    if not NAME_RE.fullmatch(args.run):
        raise UsageError(f"no run has the id or name {given!r} under {args.root}")


READS_LEDGER = ("sql", "replay", "verify", "audit", "report", "runs", "du", "delete", "export", "mcp")  # commands that read a ledger that must exist
STORED_FIRST = READS_LEDGER + ("ui", "lineage", "decide")  # commands that wait for runs finished a moment ago
OBSERVES_ROOT = ("status", "down")  # commands that look at a root's processes: a root that is not there is a mistake


def check_root(command: str, root: str) -> None:
    """--root must be a folder this user can read; for a command that reads a ledger, one that exists."""
    path = Path(root)
    try:
        exists = path.exists()
        if exists and not path.is_dir():
            raise UsageError(f"--root {root} is not a folder")
    except OSError as err:  # e.g. a folder on the way is not readable
        raise UsageError(f"--root {root}: {err.strerror}") from None
    if exists and not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"--root {root} is not readable by this user")
    if not exists and command in READS_LEDGER:
        raise UsageError(f"no ledger at {root}: no such folder")
    if not exists and command in OBSERVES_ROOT:
        raise UsageError(f"no root at {root}: no such folder")


def cmd_schema(args: argparse.Namespace) -> int:
    from runledger.ledger.contract.events import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from runledger.tools.demo import run_demo

    return run_demo(Path(args.root) if args.root else None, quick=args.quick, ui=args.ui)


# ------------------------------------------------------------------------------------ parser


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose refusal is one line, `runledger CMD: reason`, and exit 2 (the subcommands'
    parsers are of this class too)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {visible(redact.redact(message))} (see `{self.prog} --help`)\n")


def add_sql(sub) -> None:
    """The `sql` command's parser."""
    from runledger.queries import MAX_ROWS, MEMORY_LIMIT, TIMEOUT_S

    s = sub.add_parser("sql", help="read-only SQL over the ledger views")
    add_root(s)
    s.add_argument("--format", choices=["table", "csv", "json"], default="table")
    s.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                   help=f"stop the query after this long (default {TIMEOUT_S:g}; 0: no limit)")
    s.add_argument("--memory-limit", default=MEMORY_LIMIT, metavar="SIZE",
                   help=f"DuckDB's memory limit for the query, e.g. 500MB (default {MEMORY_LIMIT})")
    s.add_argument("--max-rows", type=int, default=None, metavar="N",
                   help=f"print at most N rows, saying so when there were more (default {TABLE_ROWS:,} as a table, "
                        f"{MAX_ROWS:,} as CSV or JSON; 0: no limit)")
    s.add_argument("--snapshot", type=checks.count, default=None, metavar="N",
                   help="read ledger snapshot N (a commit number, kept for tables.RETENTION_S), not the current one")
    s.add_argument("sql")
    s.set_defaults(func=cmd_sql)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser. Every module it reads is light (no JAX, numpy or nats-py): a command imports
    what it needs when it runs, so `runledger sql` starts in the time DuckDB takes to load."""
    p = Parser(prog="runledger", description="An open, auditable ledger for model-training runs.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    if command == "sql":  # only the parser of the command given, when it is `sql`: a query starts in the time DuckDB takes
        add_sql(sub)
        return p
    from runledger.tools import agents, attest, audit, chores, export, importing, ladder, mcp_server, notify, report, status, tlog, train, ui, witness

    s = sub.add_parser("demo", help="the main job, end to end on one machine")
    s.add_argument("--root", type=checks.folder, default=None,
                   help="ledger root (default: a fresh demo-* folder in runledger-demos/ of this user's data folder)")
    s.add_argument("--quick", action="store_true", help="a short version (used by a test)")
    s.add_argument("--ui", action="store_true", help="keep the dashboard (`runledger ui`) up while it runs, to watch it live")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("nats", help="a local JetStream server on loopback")
    s.add_argument("action", choices=["up", "down", "creds"])
    add_root(s)
    s.add_argument("--port", type=checks.int_in(0, 65535, "a TCP port"), default=0, help="port (default: a free one)")
    s.add_argument("--sync-interval", type=sync_interval, default=None,
                   help="JetStream fsync interval, e.g. 'always' or '10s' (default 2m)")
    s.add_argument("--secure", action="store_true", help="users per role with subject permissions, and credentials")
    s.add_argument("--runs", nargs="*", type=checks.run_id, default=[], help="with --secure: runs to make worker credentials for")
    s.add_argument("--worker", type=checks.run_id, default=None, help="creds: make worker credentials for this run")
    s.add_argument("--cluster", type=checks.int_in(0, MAX_CLUSTER, "nodes"), default=0,
                   help=f"start this many clustered nodes (stream replicas = N, at most {MAX_CLUSTER})")
    s.set_defaults(func=cmd_nats)

    s = sub.add_parser("ledger", help="the ledger service")
    s.add_argument("action", choices=["serve", "adopt-stream"],
                   help="serve the root; adopt-stream: take the server's stream in place of the one the root's "
                        "tables were fed by (a stream made anew), once the root's spools are replayed into it")
    add_root(s)
    add_nats(s)
    s.add_argument("--batch", type=checks.int_in(1, MAX_BATCH, "messages"), default=2000, help="messages fetched per batch")
    s.add_argument("--durable", type=checks.name_of("consumer name"), default="ledger", help="the durable consumer's name (one per root)")
    s.add_argument("--partitions", type=checks.int_in(1, MAX_PARTITIONS, "partitions"), default=1,
                   help="serve the root in K partitions by run, with other instances (one writer per partition, "
                        "standbys take over); every instance of a root gives the same K")
    catalog = s.add_mutually_exclusive_group()
    catalog.add_argument("--catalog", type=checks.line, default=None,
                         help="the tables' catalog as a SQLAlchemy URI (a shared PostgreSQL); default: sqlite in the "
                              "root (a password here is visible to every local user: use --catalog-file)")
    catalog.add_argument("--catalog-file", type=checks.file_in, default=None,
                         help="a file (mode 0600) holding the catalog's URI, for a URI with a password")
    s.add_argument("--warehouse", type=checks.line, default=None,
                   help="keep the tables' files on S3-compatible object storage, s3://bucket/prefix (the endpoint: "
                        "AWS_ENDPOINT_URL; credentials: the AWS_* variables or --s3-credentials); default: under the root")
    s.add_argument("--s3-credentials", type=checks.file_in, default=None,
                   help="a file (mode 0600) holding the warehouse's access key and secret key (JSON, or an AWS "
                        "credentials file's lines)")
    s.add_argument("--tsa", type=checks.line, default=None, metavar="URL",
                   help="an RFC 3161 time-stamping authority that stamps the transparency log's checkpoints "
                        "(default $RUNLEDGER_TLOG_TSA; needs the [attest] extra)")
    s.add_argument("--tsa-certs", type=checks.file_in, default=None, metavar="PEM",
                   help="the authority's root (and intermediate) certificates, to check its tokens "
                        "(default $RUNLEDGER_TLOG_TSA_CERTS)")
    s.set_defaults(func=cmd_ledger_serve)

    s = sub.add_parser("push", help="move a root's chains (stored and spooled) onto another ledger, verbatim")
    s.add_argument("source", type=Path, metavar="ROOT", help="the root whose chains go")
    s.add_argument("--to", dest="nats", type=checks.nats_url, required=True, metavar="NATS_URL",
                   help="the receiving server (its ledger must be serving)")
    s.add_argument("--creds", type=checks.file_in, default=None,
                   help=f"credentials file for the receiving server (env {settings.CREDS_ENV})")
    s.set_defaults(func=cmd_push)

    s = sub.add_parser("publish", help="validate JSON Lines envelopes from stdin and publish them")
    add_root(s)
    add_nats(s)
    s.set_defaults(func=cmd_publish)

    add_sql(sub)

    s = sub.add_parser("replay", help="the run's rebuilt state as JSON")
    s.add_argument("run", type=checks.run, help=RUN_HELP)
    add_root(s)
    s.add_argument("--as-of-seq", type=checks.count, default=None, help="only events up to this stream sequence")
    s.add_argument("--snapshot", type=checks.count, default=None, metavar="N", help="replay from ledger snapshot N (see `sql --snapshot`)")
    s.add_argument("--format", choices=["text", "json"], default="text",
                   help="json: one line with the events folded, the time taken and the state")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("verify", help="hash chains, gaps, duplicates, quarantine; exit 1 on any problem")
    add_root(s)
    s.add_argument("--repair", action="store_true",
                   help="first remove second copies of events stored twice with identical content (no ledger may serve the root)")
    s.add_argument("--format", choices=["text", "json"], default="text",
                   help="json: one line with the counts, the problems and every chain's recorded head")
    s.add_argument("--record", metavar="FILE", type=checks.file_out, default=None,
                   help="if it passes, write what was checked to FILE, for a later --since FILE")
    s.add_argument("--since", metavar="FILE", type=checks.line, default=None,
                   help="check only what was added since the verify recorded in FILE (and continue its chains); "
                        "if it passes, FILE moves on to now (or --record's FILE)")
    s.add_argument("--assume-unchanged", action="store_true",
                   help="with --since: do not read again a file checked before whose size and mtime are as recorded "
                        "(the check then costs only what is new; a file edited in place with its mtime restored "
                        "goes unnoticed: without it, every file checked before is hashed again)")
    s.add_argument("--jobs", type=checks.int_in(1, MAX_JOBS, "processes"), default=None,
                   help="processes checking rows (default: the cores usable)")
    s.add_argument("--snapshot", type=checks.count, default=None, metavar="N",
                   help="check ledger snapshot N (see `sql --snapshot`), not the current one (its heads are not checked)")
    add_signed_args(s)
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("schema", help="JSON Schema of every event kind")
    s.set_defaults(func=cmd_schema)

    s = sub.add_parser("down", help="stop the embedded local server and ledger of a root (`runledger.init` starts them)")
    add_root(s)
    s.set_defaults(func=cmd_down)

    s = sub.add_parser("sync", help="send what the root's spool holds unsent (an offline run's events) to the server")
    add_root(s)
    add_nats(s)
    s.add_argument("--run", type=checks.run_id, default=None, metavar="RUN_ID", help="only this run's chains")
    s.set_defaults(func=cmd_sync)

    for family in (train, ladder, audit, agents, report, ui, importing, notify, status, chores, export, mcp_server, tlog, attest, witness):  # (light:
        family.register(sub)  # each imports what its commands need when one runs)
    return p


# a module a command needs that the base install leaves out -> the extra that brings it
EXTRAS = {"jax": "train", "jaxlib": "train", "optax": "train", "orbax": "train", "scipy": "train",
          "openlineage": "lineage", "mlflow": "import", "tensorboard": "import", "wandb": "import",
          "psycopg2": "postgres", "polars": "readers", "daft": "readers", "mcp": "mcp"}


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The one-line reason for a command whose extra is not installed (None: not an extra's module)."""
    extra = EXTRAS.get((err.name or "").split(".")[0])
    if extra is None:
        return None
    return (f"needs the [{extra}] extra ({err.name} is not installed): pip install '.[{extra}]' in a clone of "
            f"runledger, or 'runledger[{extra}] @ git+URL'")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))  # (the command: no option before it takes a value)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    logging.getLogger("nats").setLevel(logging.CRITICAL)  # reconnect chatter; our own logs say what matters
    redact.install()  # every log line: a URL with a password is written as user:***@
    warn_secrets(args)
    from runledger.ledger.storage.locks import Busy

    try:
        if getattr(args, "root", None) is not None:
            check_root(args.command, args.root)
            if args.command in STORED_FIRST and getattr(args, "snapshot", None) is None:
                say_still_storing(args.root)  # runs finished a moment ago: stored first, or named as on their way
            resolve_run_arg(args)
        return args.func(args) or 0
    except (UsageError, Busy) as err:  # (Busy: another process holds the root, chain or consumer)
        print(f"runledger {args.command}: {one_line(err)}", file=sys.stderr)
        return 2
    except ValueError as err:
        from runledger.ledger.contract.events import InvalidEvent  # (imported here: most commands never load the contract)
        from runledger.ledger.storage.paths import NotALedger

        if not isinstance(err, (InvalidEvent, NotALedger)):
            raise
        print(f"runledger {args.command}: {one_line(err)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if (why := missing_extra(err)) is None:
            raise
        print(f"runledger {args.command}: {why}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
