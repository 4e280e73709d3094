"""`runledger runs`, `du`, `delete`: the daily chores. List runs (one row per run, the `run_list` view),
the disk each project and run takes (tables, spool, media blobs, stream), and delete a run the sanctioned way
(a tombstone, then a rewrite commit: `runledger.ledger.emit.tombstone`; then its blobs nothing else holds)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from runledger.ledger import settings
from runledger.tools import checks
from runledger.tools.args import RUN_HELP, UsageError, add_nats, add_root, resolve_nats

log = logging.getLogger("runledger")

LIST_LIMIT = 50  # rows `runs` shows unless --limit says otherwise
STATES = ("running", "finished", "failed", "crashed")  # runledger.ledger.contract.events.RUN_STATES


def run_rows(root: str | Path, project: str | None = None, state: str | None = None, name: str | None = None,
             limit: int | None = None) -> list[dict]:
    """The rows of the `run_list` view (newest start first) that the filters keep; [] for a root with no tables."""
    from runledger import queries
    from runledger.ledger.storage import paths

    if not paths.is_tables(Path(root)):
        return []
    sql = ("select * from run_list where ($project is null or project = $project) and ($state is null or state = $state)"
           " and ($name is null or name = $name or run_id = $name) order by started_at desc, run_id"
           + (f" limit {int(limit)}" if limit else ""))
    con = queries.connect(root, uses=sql)
    try:
        cur = con.execute(sql, {"project": project, "state": state, "name": name})
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _values(last: dict | None) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in (last or {}).items())


def cmd_runs(args: argparse.Namespace) -> int:
    rows = run_rows(args.root, args.project, args.state, args.name, args.limit or None)
    if args.json:
        print(json.dumps(rows, default=str, indent=1))
        return 0
    if not rows:
        print(f"no runs under {args.root}" + (" match" if args.project or args.state or args.name else ""))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} run(s) under {args.root}")
    for col in ("project", "name", "id", "state", "attempts", "steps", "last values", "start", "duration"):
        table.add_column(col, no_wrap=col in ("id", "start"))
    for r in rows:
        table.add_row(r["project"] or "-", r["name"], r["run_id"], r["state"], str(r["attempts"]), str(r["steps"]),
                      _values(r["last_values"]), r["started_at"].strftime("%Y-%m-%d %H:%M:%S"), _duration(r["duration_s"]))
    Console(width=max(120, _columns())).print(table)
    return 0


def _columns() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 120


# ------------------------------------------------------------------------------------ du


def _bytes(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def disk_use(root: str | Path, nats_url: str | None) -> dict:
    """Bytes per run and per project: the run's data files in the tables' current snapshot, its spool, the blobs its
    media events name (`runledger.ledger.storage.media`: a blob two runs name counts in each), its messages in the
    stream (counted where a server answers: JetStream gives bytes for the stream only); the stream's bytes, the
    blobs' (each once), and the whole root's."""
    from runledger.ledger.storage.paths import event_files

    from runledger.ledger.storage import media

    root = Path(root)
    blobs = media.usage(root)  # (the blobs media events name: counted per run, and once in the total)
    runs = []
    for r in run_rows(root):
        spool = settings.spool_dir(root) / r["run_id"]
        runs.append({"project": r["project"], "name": r["name"], "run_id": r["run_id"],
                     "tables_bytes": _bytes(event_files(root, None, r["run_id"])),
                     "spool_bytes": _bytes(spool.rglob("*")) if spool.is_dir() else 0,
                     "media_bytes": blobs["runs"].get(r["run_id"], 0)})
    stream = _stream_use(nats_url, [r["run_id"] for r in runs]) if nats_url else None
    for r in runs:
        r["stream_messages"] = None if stream is None else stream["runs"].get(r["run_id"], 0)
    projects: dict[str, dict] = {}
    for r in runs:
        p = projects.setdefault(r["project"] or "", {"project": r["project"], "runs": 0, "tables_bytes": 0, "spool_bytes": 0,
                                                    "media_bytes": 0})
        p["runs"] += 1
        p["tables_bytes"] += r["tables_bytes"]
        p["spool_bytes"] += r["spool_bytes"]
        p["media_bytes"] += r["media_bytes"]
    total = {"tables_bytes": sum(r["tables_bytes"] for r in runs), "spool_bytes": _bytes(settings.spool_dir(root).rglob("*")),
             "media_bytes": blobs["bytes"], "media_blobs": blobs["blobs"], "media_unnamed": blobs["unnamed"],
             "stream_bytes": None if stream is None else stream["bytes"], "root_bytes": _bytes(root.rglob("*"))}
    return {"root": str(root), "projects": sorted(projects.values(), key=lambda p: -p["tables_bytes"]),
            "runs": sorted(runs, key=lambda r: -r["tables_bytes"]), "total": total}


def _stream_use(nats_url: str, run_ids: list[str]) -> dict | None:
    """{"bytes": the stream's, "runs": run_id -> its messages in the stream}, or None if no server answers."""
    import asyncio

    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX

    async def ask() -> dict:
        nc = await bus.connect(nats_url, max_reconnect_attempts=0, connect_timeout=3)
        try:
            info = await nc.jetstream().stream_info(STREAM, subjects_filter=f"{SUBJECT_PREFIX}.>")
            per = {}
            for subject, n in (info.state.subjects or {}).items():
                run = subject.split(".")[1]
                per[run] = per.get(run, 0) + n
            return {"bytes": info.state.bytes, "runs": {r: per.get(r, 0) for r in run_ids}}
        finally:
            await nc.close()

    try:
        return asyncio.run(asyncio.wait_for(ask(), 10))
    except Exception as err:  # no server, or no stream: the stream is not measured
        log.info("the stream is not measured (%s)", str(err).splitlines()[0] if str(err) else type(err).__name__)
        return None


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _server_if_any(args: argparse.Namespace) -> str | None:
    """The server the flags or the environment name, else the root's running local one, else None."""
    if args.nats or args.creds or os.environ.get(settings.NATS_ENV) or os.environ.get(settings.CREDS_ENV) \
            or (settings.nats_dir(args.root) / "url").exists():
        return resolve_nats(args)
    from runledger.ledger import local

    return local.running_url(args.root)


def cmd_du(args: argparse.Namespace) -> int:
    doc = disk_use(args.root, _server_if_any(args))
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, _columns()))
    t = Table(title=f"disk per project under {doc['root']}")
    for col in ("project", "runs", "tables", "spool", "media"):
        t.add_column(col)
    for p in doc["projects"]:
        t.add_row(p["project"] or "-", str(p["runs"]), _size(p["tables_bytes"]), _size(p["spool_bytes"]), _size(p["media_bytes"]))
    console.print(t)
    t = Table(title="disk per run")
    for col in ("project", "name", "id", "tables", "spool", "media", "stream msgs"):
        t.add_column(col)
    for r in doc["runs"]:
        t.add_row(r["project"] or "-", r["name"], r["run_id"], _size(r["tables_bytes"]), _size(r["spool_bytes"]),
                  _size(r["media_bytes"]), "-" if r["stream_messages"] is None else str(r["stream_messages"]))
    console.print(t)
    total = doc["total"]
    print(f"total: tables {_size(total['tables_bytes'])}, spool {_size(total['spool_bytes'])}, media "
          f"{_size(total['media_bytes'])} in {total['media_blobs']} blobs, stream "
          f"{_size(total['stream_bytes']) if total['stream_bytes'] is not None else 'not measured (no server)'}; "
          f"the whole root {_size(total['root_bytes'])}")
    return 0


# ------------------------------------------------------------------------------------ delete


def cmd_delete(args: argparse.Namespace) -> int:
    from runledger.ledger.emit import tombstone

    if (args.run is None) == (args.project is None):
        raise UsageError("delete takes a RUN or --project P (one of them)")
    if args.project is not None:
        targets = [(r["run_id"], r["name"]) for r in run_rows(args.root, project=args.project)]
        if not targets:
            raise UsageError(f"no runs of project {args.project!r} under {args.root}")
    else:
        found = run_rows(args.root, name=args.run)
        targets = [(args.run, found[0]["name"] if found else args.run)]
    listed = ", ".join(f"{name} ({rid})" if name != rid else rid for rid, name in targets)
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"delete {listed}: confirm with --yes (stdin is not a terminal to ask)")
        answer = input(f"delete {len(targets)} run(s): {listed}? Their rows leave the tables; a tombstone records it. "
                       "[y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    attachment = None
    if args.nats or args.creds or os.environ.get(settings.NATS_ENV) or os.environ.get(settings.CREDS_ENV) \
            or (settings.nats_dir(args.root) / "url").exists():
        url = resolve_nats(args)
    else:  # the embedded default: the root's local server and ledger, started if need be
        from runledger.ledger import local

        attachment = local.attach(args.root)
        url = attachment.url
    from runledger.ledger.storage import media

    failed = 0
    try:
        for run_id, name in targets:
            blobs = media.named(Path(args.root), run_id)  # (before its rows go)
            try:
                done = tombstone.delete_run(args.root, url, run_id, args.reason, args.timeout)
            except LookupError as err:
                log.error("%s", err)
                failed += 1
                continue
            removed, kept = media.remove_unheld(Path(args.root), set(blobs))
            if blobs:
                print(f"blobs of run {run_id}: {len(removed)} removed, {len(kept)} kept (another run's events name them, "
                      f"or they were used in the last {media.GRACE_S:.0f} s)")
            print(f"deleted run {run_id}" + (f" ({name})" if name != run_id else "")
                  + f": tombstone {done.tombstone}, {done.events} events; spool chains removed: {len(done.spool_removed)}"
                  + (f"; left (a live process holds them): {', '.join(done.spool_held)}" if done.spool_held else ""))
    except TimeoutError as err:
        raise UsageError(str(err)) from None
    finally:
        if attachment is not None:
            attachment.release()
    return 1 if failed else 0


def register(sub) -> None:
    s = sub.add_parser("runs", help="list runs, one row per run (project, name, id, state, attempts, steps, last values)")
    add_root(s)
    s.add_argument("--project", default=None, help="only this project's runs")
    s.add_argument("--state", choices=STATES, default=None, help="only runs in this state")
    s.add_argument("--name", default=None, help="only runs of this name (or id)")
    s.add_argument("--limit", type=checks.int_in(0, 10**9, "rows"), default=LIST_LIMIT,
                   help=f"at most this many, newest first (default {LIST_LIMIT}; 0: all)")
    s.add_argument("--json", action="store_true", help="JSON, one object per run")
    s.set_defaults(func=cmd_runs)

    s = sub.add_parser("du", help="disk per project and per run: tables, spool, stream")
    add_root(s)
    add_nats(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_du)

    s = sub.add_parser("delete", help="delete a run, or a project's runs: a tombstone, then a rewrite commit")
    s.add_argument("run", nargs="?", default=None, help=RUN_HELP)
    add_root(s)
    add_nats(s)
    s.add_argument("--project", default=None, help="delete every run of this project")
    s.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    s.add_argument("--reason", default=None, help="why, recorded in the tombstone")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the ledger to store and remove")
    s.set_defaults(func=cmd_delete)
