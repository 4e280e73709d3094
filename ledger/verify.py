"""Verify the stored ledger: every hash, every chain, no duplicates, typed columns true to the payload.

`verify(root)` returns a `Report`; `runledger verify` prints it and exits 1 on any problem. What is
checked, per stored row: the hash recomputed from the envelope columns and the payload text; the
payload text is canonical and valid for its kind; the typed payload columns equal what the payload
says; the event_id rule; the file's partition matches the row. Per (run_id, producer, attempt):
seqs gapless from 0 and each prev_hash equal to the previous event's hash. Across the ledger: no
event_id stored twice. Quarantined input is counted and summarised (it is not a problem of the
ledger: it was refused and kept).

Conflicts are problems too: a different event that came under a stored event_id is in quarantine
(two producers wrote one chain), so the stored chain is not the whole story.

`repair(root)` (`runledger verify --repair`) removes second copies of events stored twice with
identical content (two ledgers on one root, before the root lock), keeping the first; copies that
differ are left and reported.

Truncation: every chain must reach the head the ledger recorded for it (`ledger.heads`), so a chain
whose tail was removed, a chain removed whole, or a run's folder deleted is a problem too.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ledger import heads, locks, store
from ledger.canonical import canonical_json, event_hash
from ledger.events import KINDS, InvalidEvent, make_event_id
from ledger.validation import check_payload

MAX_LISTED = 50


@dataclass
class Report:
    events: int = 0
    files: int = 0
    chains: int = 0
    problems: list[str] = field(default_factory=list)
    quarantined: int = 0
    quarantine_reasons: Counter = field(default_factory=Counter)
    heads: dict[str, dict] = field(default_factory=dict)  # "run:producer:attempt" -> the recorded head (seq, hash)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        return {"ok": self.ok, "events": self.events, "files": self.files, "chains": self.chains,
                "quarantined": self.quarantined, "problems": self.problems, "heads": self.heads}

    def text(self) -> str:
        lines = [f"{self.events} events in {self.files} files, {self.chains} chains; "
                 f"{self.quarantined} quarantined messages"]
        for reason, n in self.quarantine_reasons.most_common(10):
            lines.append(f"  quarantine: {n} × {reason}")
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s):")
            lines += [f"  - {p}" for p in self.problems[:MAX_LISTED]]
            if len(self.problems) > MAX_LISTED:
                lines.append(f"  … and {len(self.problems) - MAX_LISTED} more")
        else:
            lines.append("ok: every hash, chain and typed column checks out")
        return "\n".join(lines)


_LINK = ("run_id", "producer", "attempt", "seq", "prev_hash", "hash", "event_id")
_REQUIRED = (*_LINK, "kind", "time", "schema_version", "payload")


def _check_file(path: Path, kind: str, run_id: str, report: Report, links: list) -> None:
    table = pq.read_table(path)
    if not store.digest_ok(path, table):
        report.problems.append(f"{path}: the ledger's columns (event_id, stream_seq, ts, ingested_at) do not match "
                               "the digest it recorded for this file (changed after it was written?)")
    columns = store.payload_columns(kind) if kind in KINDS else {}
    typed = [c for c, ck in columns.items() if ck != "wide"]
    maps = {c for c in typed if columns[c].startswith("map_")}  # read back as [(name, value)]
    wide = [c for c in table.column_names if c.split("/", 1)[0] in columns and columns[c.split("/", 1)[0]] == "wide"]
    for row in table.to_pylist():
        eid = row.get("event_id")
        where = f"{eid} ({path.relative_to(path.parents[2])})"
        try:
            missing = [c for c in _REQUIRED if row.get(c) is None]
            if missing:  # a cell emptied or a column dropped: nothing else about the row can be trusted
                raise InvalidEvent(f"no value in {', '.join(missing)}")
            if row["kind"] != kind or row["run_id"] != run_id:
                raise InvalidEvent(f"row of kind {row['kind']!r}, run {row['run_id']!r} stored under kind={kind}/run_id={run_id}")
            if eid != make_event_id(row["run_id"], row["producer"], row["attempt"], row["seq"]):
                raise InvalidEvent("event_id does not match run_id:producer:attempt:seq")
            payload = json.loads(row["payload"])
            if canonical_json(payload) != row["payload"]:
                raise InvalidEvent("payload text is not canonical JSON")
            if event_hash(row, row["payload"]) != row["hash"]:
                raise InvalidEvent("hash does not match the stored content (changed after it was written?)")
            if row["ts"] is not None and row["ts"] != _ts_of(row["time"]):
                raise InvalidEvent(f"ts {row['ts']} is not the event's time {row['time']}")
            check_payload(kind, payload)
            expected = store.typed_columns(kind, [payload])
            for col in typed:
                if (dict(row[col]) if col in maps and row[col] is not None else row[col]) != expected[col][0]:
                    raise InvalidEvent(f"column {col} = {row[col]!r} but the payload says {expected[col][0]!r}")
            for col in wide:  # a DOUBLE column per name: null where the payload has no such name
                if row[col] != (expected[col][0] if col in expected else None):
                    raise InvalidEvent(f"column {col} = {row[col]!r} but the payload says "
                                       f"{expected[col][0] if col in expected else 'nothing'}")
        except (InvalidEvent, ValueError, TypeError, KeyError) as err:
            report.problems.append(f"{where}: {err}")
        if any(row.get(c) is None for c in _LINK):
            continue  # reported above; it cannot take part in the chain check
        links.append((row["run_id"], row["producer"], row["attempt"], row["seq"], row["prev_hash"], row["hash"], eid))
    report.events += table.num_rows
    report.files += 1


def _ts_of(time_text: str):
    """The `ts` column the ledger derives from an event's (hashed) `time`."""
    return pa.array([time_text]).cast(pa.timestamp("ns", tz="UTC")).cast(store.TIMESTAMP, safe=False)[0].as_py()


VERIFY_TRIES = 5  # a live ledger may compact or write while verify reads: read again, up to this often


def _files_now(root: Path) -> list[tuple[str, int]] | None:
    """The files verify reads, with their mtimes (None if one vanished while looking)."""
    paths = [*store.event_files(root), *store.quarantine_files(root), *sorted((root / heads.HEADS_DIR).glob("*.json"))]
    try:
        return [(str(p), p.stat().st_mtime_ns) for p in paths]
    except FileNotFoundError:
        return None


def verify(root: str | Path) -> Report:
    """Check a root (see the module docstring). A ledger serving it may compact or write meanwhile: a
    read whose files changed under it is done again (VERIFY_TRIES), so a file compacted away is never
    reported as a chain cut short."""
    root = Path(root)
    report = Report()
    for _ in range(VERIFY_TRIES):
        before = _files_now(root)
        report = _verify_once(root)
        if before is not None and before == _files_now(root):
            break
    return report


def _verify_once(root: Path) -> Report:
    report = Report()
    links: list[tuple] = []
    for path in store.stray_files(root):  # the views read exactly the files verify reads (paths.event_glob)
        report.problems.append(f"{path}: a stray Parquet file, outside the ledger's layout (planted?)")
    for path in store.event_files(root):
        kind = path.parent.parent.name.removeprefix("kind=")
        run_id = path.parent.name.removeprefix("run_id=")
        if kind not in KINDS:
            report.problems.append(f"{path}: unknown kind {kind!r}")
            continue
        try:
            _check_file(path, kind, run_id, report, links)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError: not Parquet, truncated
            report.problems.append(f"{path}: cannot be read ({str(err).splitlines()[0][:200]})")
    seen = Counter(link[6] for link in links)
    for eid, n in seen.items():
        if n > 1:
            report.problems.append(f"{eid}: stored {n} times")
    chains: dict[tuple, list] = {}
    for link in links:
        chains.setdefault(link[:3], []).append(link)
    report.chains = len(chains)
    for (run_id, producer, attempt), rows in sorted(chains.items()):
        rows.sort(key=lambda r: r[3])
        prev_seq, prev_hash = -1, ""
        for _, _, _, seq, ph, h, eid in rows:
            if seq == prev_seq:
                continue  # a duplicate, reported above
            if seq != prev_seq + 1:
                first, last = (make_event_id(run_id, producer, attempt, s) for s in (prev_seq + 1, seq - 1))
                missing = first if first == last else f"{first} .. {last}"
                report.problems.append(f"{missing} missing: seq {prev_seq + 1}..{seq - 1} of {run_id}:{producer}:{attempt} "
                                       f"(gap before {eid})")
            elif ph != prev_hash:
                report.problems.append(f"{eid}: prev_hash does not match the hash of seq {seq - 1} (chain broken)")
            prev_seq, prev_hash = seq, h
    _check_heads(root, links, report)
    for (run_id, producer, attempt), seqs in sorted(store.stored_conflicts(root).items()):
        for seq in sorted(seqs):
            report.problems.append(f"{make_event_id(run_id, producer, attempt, seq)}: a different event with this id is in "
                                   f"quarantine ({store.CONFLICT}: two producers on one chain?)")
    qfiles = store.quarantine_files(root)
    for f in qfiles:
        try:
            t = pq.read_table(f, columns=["reason"])
        except (OSError, ValueError) as err:
            report.problems.append(f"{f}: cannot be read ({str(err).splitlines()[0][:200]})")
            continue
        report.quarantined += t.num_rows
        report.quarantine_reasons.update(re.sub(r"\d+", "N", r)[:90] for r in t.column(0).to_pylist())
    return report


def _check_heads(root: Path, links: list[tuple], report: Report) -> None:
    """Every chain reaches the head the ledger recorded for it (see ledger.heads): its tail, the whole
    chain, or the whole run cannot be gone unnoticed."""
    stored: dict[tuple, dict[int, str]] = {}
    for run_id, producer, attempt, seq, _, h, _ in links:
        stored.setdefault((run_id, producer, attempt), {})[seq] = h
    runs = {chain[0] for chain in stored}
    if not heads.recorded(root):
        if runs:
            report.problems.append(f"{root}: no chain heads recorded ({heads.HEADS_DIR}/ is missing), so a chain cut short "
                                   "cannot be found; a root from before heads were recorded gets them when a ledger "
                                   "next serves it")
        return
    recorded, unreadable = heads.read_all(root)
    report.problems += unreadable
    for run_id in sorted(runs - recorded.keys()):
        if not heads.run_file(root, run_id).exists():
            report.problems.append(f"run {run_id}: events are stored but no chain heads are recorded for it "
                                   f"({heads.run_file(root, run_id).relative_to(root)} is missing)")
    for run_id, chains in sorted(recorded.items()):
        for (producer, attempt), (seq, h) in sorted(chains.items()):
            chain = f"{run_id}:{producer}:{attempt}"
            have = stored.get((run_id, producer, attempt))
            if not have:
                report.problems.append(f"chain {chain}: the ledger stored it up to seq {seq}, but none of it is here "
                                       "(deleted?)")
            elif seq not in have:
                report.problems.append(f"chain {chain}: the ledger stored it up to seq {seq}, but it ends at seq "
                                       f"{max(have)} here (cut short?)")
            elif have[seq] != h:
                report.problems.append(f"{make_event_id(run_id, producer, attempt, seq)}: its hash is not the one the ledger "
                                       f"recorded as the head of {chain} (replaced?)")
    report.heads = {f"{run}:{p}:{a}": {"seq": s, "hash": h}
                    for run, chains in recorded.items() for (p, a), (s, h) in chains.items()}


def repair(root: str | Path) -> tuple[dict[str, int], list[str]]:
    """Remove the extra copies of events stored more than once with identical content; keep the first.
    Holds the root's lock, so no ledger writes meanwhile (raises locks.Busy if one serves the root).
    Returns ({event_id: copies removed}, [event_ids stored more than once with different content])."""
    root = Path(root)
    removed: Counter = Counter()
    differing: list[str] = []
    with locks.hold(root / "ledger.lock", f"ledger root {root}"):
        store.recover(root)
        for part in sorted((root / "events").glob("kind=*/run_id=*")):
            gone, left = store.drop_identical_duplicates(part)
            removed.update(gone)
            differing += left
    return dict(removed), differing
