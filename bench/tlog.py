"""The transparency log's cost, in one command (issue 47):

    python -m bench.tlog --events 50000 --per-commit 1000 --repeat 3

- ingest events/s through the ledger's own write+commit (runledger.ledger.ingest.service.Ledger, no NATS:
  the part the log adds to) with the log on against off ($RUNLEDGER_TLOG=off), alternated, medians;
- tile bytes per event (tiles, bundles, checkpoint) against the Parquet's (every file under events/);
- the audit's events/s (`runledger tlog audit`'s work: signature, rebuild, leaves <-> events, verify)
  against `verify`'s alone, on the same root;
- an inclusion proof's size (a tlog-proof text) and the time to make one from the tiles.

The audit at scale, in one command (issue 47: its events/s at 1M events at least half of `verify`'s):

    python -m bench.tlog --audit-at 1000000 [--repeat 3] [--keep DIR] [--before DIR]

builds a root of that many events with its log (the tables by bench.verify.write_sealed_run, the project's
writer; the log by the ledger's own catch-up, runledger.ledger.tlog.log.open_for over the stored events:
what every ledger start does for events without a leaf, one leaf each in stream order, tiles, bundles and a
signed checkpoint), then runs `runledger verify --root R` and `runledger tlog audit --log R/tlog --vkey V
--events R` (which does verify's work too) as processes, alternated, `--repeat` times each, medians of wall
time; `--before DIR` also runs the audit from the checkout in DIR (`git archive` of an earlier commit) in
the same alternation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def _messages(n: int, runs: int = 4) -> list[tuple[str, bytes, int]]:
    from runledger.ledger.contract.events import subject_for
    from runledger.ledger.emit.sealing import seal

    msgs, sseq = [], 0
    per = n // runs
    for r in range(runs):
        prev = ""
        for s in range(per):
            env, text = seal(f"bench-{r}", "worker-0", 0, s, "step",
                             {"loss": 1.0 / (s + 1), "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1}, s, prev)
            prev = env["hash"]
            sseq += 1
            msgs.append((subject_for(f"bench-{r}", "step"), text.encode(), sseq))
    msgs.sort(key=lambda m: (m[2] % per, m[2]))  # runs interleaved, as several workers send
    return [(s, d, i + 1) for i, (s, d, _) in enumerate(msgs)]


def ingest(root: Path, msgs, per_commit: int, log_on: bool) -> float:
    from runledger.ledger.ingest import service

    os.environ["RUNLEDGER_TLOG"] = "on" if log_on else "off"
    ledger = service.Ledger(root)
    started = time.perf_counter()
    for i in range(0, len(msgs), per_commit):
        ledger.write(ledger.decode(msgs[i:i + per_commit]))
        ledger.note_taken(msgs[min(i + per_commit, len(msgs)) - 1][2])
        ledger.commit()
    if ledger.tlog is not None:
        ledger.tlog.sign()
    return len(msgs) / (time.perf_counter() - started)


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def build_logged_root(root: Path, events: int) -> None:
    """`events` sealed events in `root` (bench.verify's writer) and their log, made by the ledger's catch-up
    (open_for: a leaf for each stored event without one) and signed with $RUNLEDGER_TLOG_KEY."""
    from bench.verify import write_sealed_run
    from runledger.ledger.tlog import log

    write_sealed_run(root, events)
    lg = log.open_for(root, None, log.stored_events(root))
    assert lg is not None and lg.size == events and (lg.dir / "checkpoint").exists()


def audit_at(events: int, repeat: int, keep: Path | None, before: Path | None) -> None:
    """`runledger tlog audit` against `runledger verify` on a root of `events` events, as processes."""
    import sys

    from bench.verify import load, measure
    from runledger.ledger.tlog import log, note

    base = keep or Path(tempfile.mkdtemp(prefix="bench-tlog-audit-"))
    os.environ[log.KEY_ENV] = str(base / "keys" / "tlog.key")
    root = base / f"root-{events}"
    if not (root / "tlog" / "checkpoint").exists():
        started = time.perf_counter()
        build_logged_root(root, events)
        print(f"built {events:,} events with their log in {time.perf_counter() - started:.0f} s")
    vkey = note.read_key(log.key_file()).verifier.text()
    cli = [sys.executable, "-m", "runledger.tools.cli"]
    runs = {"verify": [*cli, "verify", "--root", str(root)],
            "tlog audit": [*cli, "tlog", "audit", "--log", str(root / "tlog"), "--vkey", vkey, "--events", str(root)]}
    if before is not None:
        runs["tlog audit, before"] = runs["tlog audit"]
    walls: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeat):
        for name, argv in (runs.items() if i % 2 == 0 else reversed(runs.items())):
            state = base / f"state-{name.replace(' ', '-').replace(',', '')}-{i}"  # (a first audit each time)
            argv = [*argv, "--state", str(state)] if "audit" in name else argv
            env = dict(os.environ)
            if name.endswith("before"):
                env["RUNLEDGER_WORKTREE"] = str(before)  # (the dev sitecustomize's mapping, where there is one)
            m = _measure_in(measure, argv, before if name.endswith("before") else None, env)
            assert ("ok: " in m["out"]) if "audit" in name else ("ok" in m["out"].lower()), m["out"][-400:]
            walls[name].append(m["wall_s"])
    v = statistics.median(walls["verify"])
    print(f"{events:,} events, medians of {repeat} ({load()}):")
    for name, w in walls.items():
        print(f"  {name:<20} {statistics.median(w):7.2f} s {events / statistics.median(w):>10,.0f} ev/s   "
              f"(each: {', '.join(f'{x:.2f}' for x in w)})")
    for name in walls:
        if "audit" in name:
            a = statistics.median(walls[name])
            paired = [x / y for x, y in zip(walls["verify"], walls[name])]  # (the same round: the same load, nearly)
            print(f"  {name}: audit/verify events/s {v / a:.2f} of the medians; by round "
                  f"{', '.join(f'{r:.2f}' for r in paired)}, median {statistics.median(paired):.2f} (the goal: at least 0.5)")


def _measure_in(measure, argv: list[str], cwd: Path | None, env: dict) -> dict:
    """bench.verify.measure with `env` for the child (its environment is this process's)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return measure(argv, cwd)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--per-commit", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--audit-at", type=int, default=None, metavar="N",
                    help="only the audit against verify, on a root of N events (built, or kept in --keep)")
    ap.add_argument("--keep", type=Path, default=None, help="with --audit-at: build the root here and keep it")
    ap.add_argument("--before", type=Path, default=None, metavar="DIR",
                    help="with --audit-at: also the audit from the checkout in DIR, in the same alternation")
    args = ap.parse_args()
    if args.audit_at:
        audit_at(args.audit_at, args.repeat, args.keep, args.before)
        return 0
    from runledger.ledger.check.verify import verify
    from runledger.ledger.tlog import audit, log, merkle, note, tiles
    from runledger.ledger.tlog.checkpoint import Checkpoint, proof_text

    tmp = Path(tempfile.mkdtemp(prefix="bench-tlog-"))
    os.environ.setdefault("RUNLEDGER_TLOG_KEY", str(tmp / "keys" / "tlog.key"))
    msgs = _messages(args.events)
    rates: dict[bool, list[float]] = {True: [], False: []}
    roots = []
    for i in range(args.repeat):
        for on in (False, True) if i % 2 == 0 else (True, False):
            root = tmp / f"r{i}-{'on' if on else 'off'}"
            rates[on].append(ingest(root, msgs, args.per_commit, on))
            if on:
                roots.append(root)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"ingest (write+commit, {args.per_commit} events a commit, {args.events} events, medians of {args.repeat}): "
          f"log off {off:,.0f} ev/s, log on {on:,.0f} ev/s, on/off {on / off:.2f}")
    root = roots[-1]
    tb, pb = _bytes(root / "tlog"), _bytes(root / "events")
    print(f"bytes per event: tlog {tb / args.events:.1f} (tiles, bundles, checkpoint: {tb:,} B), "
          f"Parquet {pb / args.events:.1f} (events/: {pb:,} B), tlog/Parquet {tb / pb:.2f}")
    vkey = note.read_key(log.key_file()).verifier
    t0 = time.perf_counter()
    report = verify(root)
    tv = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = audit.audit(str(root / "tlog"), [vkey], root, seen=tmp / "seen")
    ta = time.perf_counter() - t0
    assert report.ok and done.events == args.events
    print(f"audit {args.events / ta:,.0f} ev/s ({ta:.2f} s, verify included) vs verify {args.events / tv:,.0f} ev/s "
          f"({tv:.2f} s): audit/verify {tv / ta:.2f}")
    reader = tiles.Tiles(root / "tlog")
    signed = reader.checkpoint()
    cp = Checkpoint.parse(signed[:signed.rfind("\n\n") + 1])
    t0 = time.perf_counter()
    k = 50
    for j in range(k):
        idx = (j * 7919) % cp.size
        proof = merkle.inclusion_proof(tiles.Tiles(root / "tlog").node(cp.size), idx, cp.size)
    tp = (time.perf_counter() - t0) / k
    text = proof_text(idx, proof, signed)
    print(f"inclusion proof: {len(proof)} hashes, tlog-proof text {len(text)} B; made from the tiles in "
          f"{tp * 1000:.1f} ms (cold tile reads each)")
    print(f"(tmp: {tmp}; load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
