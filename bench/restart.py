"""A ledger's restart against the events its root stores: the place read from the tables' commit
(runledger.ledger.storage.streampos) against the stored set rebuilt from every stored event (what a
restart did before), in one command:

    python -m bench.restart [--sizes 100000 1000000 10000000] [--runs-per-size-step 100000] [--keep DIR]

Each root is written through the ledger's own write path (`Ledger.write` and `commit`: files per run,
chain heads, compaction, the position in the commit) with `step` events in runs of RUN_EVENTS, so a
bigger root has more runs and more files, as a lab's does. Then, per root, in this process (pyiceberg
imported already: the import is the same for every size), each restart from a cold handle:

- `now`: `Ledger(root)` (recovery, the tables opened, the place read from the current snapshots, the
  heads, the quarantine) and the first fetch after a crash between commit and ack: the last
  REDELIVERED messages handed to `decode` again, all at or below the place (skipped, no lookup);
- `before`: what the restart did before, on the same root: the stored set rebuilt from every stored
  event (`SeqIndex.load`) and the position from every file's highest stream seq (`positions.taken_upto`).
- `log now`: the transparency log's start alone (`tlog.for_ledger`, the tables opened before), as `now` does it.
- `log before`: what the transparency log's start did before (issue 47), on the same root: every stored
  event's key read (`tlog.stored_events`) and the log rebuilt from every entry bundle (`Log.open`). Its
  start now (in `now`) reads the right edge's tiles and the commits since the log's signed size
  (runledger.ledger.storage.leaves); the bench checks that `now` never reads every stored event.

The log is on, as a user's ledger has it (its key in the bench's folder unless $RUNLEDGER_TLOG_KEY).

The events' hashes are not real (no reader checks them here): sealing 10M events would take the bench
longer than the restarts it measures. Goal (issue 46): at 10M within 1.2x of the time at 100k.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

log = logging.getLogger("bench.restart")

RUN_EVENTS = 100_000  # events per run
WRITE_EVENTS = 50_000  # events per ledger write and commit (the ledger writes a file per run per commit)
REDELIVERED = 2_000  # the first fetch after a crash between commit and ack: a batch at or below the place
STREAM_ID = "RUNLEDGER@bench"
REPEAT = 3
BIG = 10_000_000  # from this size on, the log's start before is timed once (minutes, and GBs of keys)
PAYLOAD = '{"grad_norm":1.0,"loss":0.5,"lr":0.001,"step_time_s":0.1,"tokens":8}'


def _envs(run_id: str, first: int, count: int) -> tuple[list[dict], list[str]]:
    envs = [{"event_id": f"{run_id}:worker-0:0:{s}", "run_id": run_id, "producer": "worker-0", "attempt": 0,
             "seq": s, "kind": "step", "time": "2026-12-07T00:00:00.000000Z", "step": s, "schema_version": 1,
             "prev_hash": "0" * 64, "hash": f"{s:064x}",
             "payload": {"loss": 0.5, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1}}
            for s in range(first, first + count)]
    return envs, [PAYLOAD] * count


def build(root: Path, events: int) -> float:
    """Write `events` step events into `root` through the ledger's write path; returns seconds taken."""
    from runledger.ledger.ingest import service
    from runledger.ledger.storage import store

    started = time.perf_counter()
    ledger = service.Ledger(root)
    ledger.stream_id = STREAM_ID
    sseq = 0
    for r in range(max(1, events // RUN_EVENTS)):
        run_id = f"run-{r:05d}"
        for first in range(0, min(RUN_EVENTS, events), WRITE_EVENTS):
            envs, texts = _envs(run_id, first, min(WRITE_EVENTS, RUN_EVENTS - first, events))
            ledger.write(service.Decoded(batches=[(envs, texts, sseq + len(envs))]))
            sseq += len(envs)
            ledger.note_taken(sseq)
            ledger.commit()
        for part in list(ledger._unmerged):  # compacted as the ledger does when idle
            ledger._compact(part)
    store.forget_tables(root)
    return time.perf_counter() - started


def _redelivered(root: Path, events: int) -> list[tuple[str, bytes, int]]:
    from runledger.ledger.contract.canonical import envelope_text
    from runledger.ledger.contract.events import subject_for

    run_id = f"run-{max(1, events // RUN_EVENTS) - 1:05d}"
    last = min(RUN_EVENTS, events)
    envs, texts = _envs(run_id, last - REDELIVERED, REDELIVERED)
    first_sseq = events - REDELIVERED + 1
    return [(subject_for(run_id, "step"), envelope_text({**e, "payload": None}, t, True).encode(), first_sseq + i)
            for i, (e, t) in enumerate(zip(envs, texts))]


def restart_now(root: Path, redelivered) -> tuple[float, int]:
    from runledger.ledger.ingest import service
    from runledger.ledger.storage import store
    from runledger.ledger.tlog import log as tlog

    store.forget_tables(root)
    every_event = tlog.stored_events
    tlog.stored_events = _never  # (the log's start must not read every stored event)
    try:
        started = time.perf_counter()
        ledger = service.Ledger(root)
        decoded = ledger.decode(redelivered)
        took = time.perf_counter() - started
    finally:
        tlog.stored_events = every_event
    assert not decoded.events and ledger.counters.skipped == len(redelivered), ledger.counters
    assert not ledger.index.loaded
    assert ledger.tlog is not None and ledger.tlog.size == ledger.taken_upto, "the log is off, or behind"
    return took, ledger.taken_upto


def _never(*args, **kw):
    raise AssertionError("the restart read every stored event for the transparency log")


def restart_log_now(root: Path) -> float:
    """The log's start alone, as `Ledger(root)` does it (the tables opened before): its right edge, the
    commits since its signed size, never every stored event."""
    from runledger.ledger.ingest.position import LedgerPosition
    from runledger.ledger.storage import store
    from runledger.ledger.tlog import log as tlog

    store.forget_tables(root)
    tables = store.tables_of(root)
    every_event, tlog.stored_events = tlog.stored_events, _never
    try:
        started = time.perf_counter()
        lg = tlog.for_ledger(root, LedgerPosition(), tables)
        took = time.perf_counter() - started
    finally:
        tlog.stored_events = every_event
    assert lg is not None and lg.size > 0
    return took


def restart_log_before(root: Path) -> float:
    """The log's start before: every stored event's key read, the log rebuilt from every entry bundle."""
    from runledger.ledger.storage import store
    from runledger.ledger.tlog import log as tlog

    store.forget_tables(root)
    started = time.perf_counter()
    lg = tlog.Log(root, None, tlog.load_or_make_key())
    assert lg.open(tlog.stored_events(root)) == 0
    return time.perf_counter() - started


def restart_before(root: Path) -> tuple[float, int]:
    from runledger.ledger.storage import index, positions, store

    store.forget_tables(root)
    started = time.perf_counter()
    stored = index.SeqIndex.load(root)
    upto = positions.taken_upto(root)
    took = time.perf_counter() - started
    assert upto > 0 and len(stored) > 0
    return took, upto


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.restart")
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--keep", type=Path, default=None, help="keep the roots in this folder (reused if there)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-restart-"))
    os.environ.setdefault("RUNLEDGER_TLOG_KEY", str(base / "keys" / "tlog.key"))
    rows = []
    try:
        for n in args.sizes:
            root = base / f"root-{n}"
            built = None
            if not (root / "tables.json").exists():
                built = build(root, n)
            redelivered = _redelivered(root, n)
            now = [restart_now(root, redelivered) for _ in range(REPEAT)]
            before = [restart_before(root) for _ in range(REPEAT)]
            log_now = [restart_log_now(root) for _ in range(REPEAT)]
            log_before = [restart_log_before(root) for _ in range(REPEAT if n < BIG else 1)]
            assert now[0][1] == before[0][1] == n
            files = sum(1 for _ in root.glob("events/kind=step/*/*.parquet"))
            rows.append({"events": n, "runs": max(1, n // RUN_EVENTS), "files": files, "build_s": built,
                         "now_s": statistics.median(t for t, _ in now),
                         "before_s": statistics.median(t for t, _ in before),
                         "log_now_s": statistics.median(log_now), "log_before_s": statistics.median(log_before)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    first = rows[0]
    print(f"load {os.getloadavg()[0]:.2f}")
    print("| events stored | runs | files | restart now, log on (s) | now / smallest | restart before (s) "
          "| before / smallest | log's start now (s) | log now / smallest | log's start before (s) "
          "| log before / smallest |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['events']:,} | {r['runs']} | {r['files']} | {r['now_s']:.3f} | {r['now_s'] / first['now_s']:.2f} "
              f"| {r['before_s']:.3f} | {r['before_s'] / first['before_s']:.2f} "
              f"| {r['log_now_s']:.4f} | {r['log_now_s'] / first['log_now_s']:.2f} "
              f"| {r['log_before_s']:.3f} | {r['log_before_s'] / first['log_before_s']:.2f} |")


if __name__ == "__main__":
    main()
