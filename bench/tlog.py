"""The transparency log's cost, in one command (issue 47):

    python -m bench.tlog --events 50000 --per-commit 1000 --repeat 3

- ingest events/s through the ledger's own write+commit (runledger.ledger.ingest.service.Ledger, no NATS:
  the part the log adds to) with the log on against off ($RUNLEDGER_TLOG=off), alternated, medians;
- tile bytes per event (tiles, bundles, checkpoint) against the Parquet's (every file under events/);
- the audit's events/s (`runledger tlog audit`'s work: signature, rebuild, leaves <-> events, verify)
  against `verify`'s alone, on the same root;
- an inclusion proof's size (a tlog-proof text) and the time to make one from the tiles.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--per-commit", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
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
