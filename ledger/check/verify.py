"""Verify the stored ledger: every hash, every chain, no duplicates, typed columns true to the payload.

`verify(root)` returns a `Report`; `runledger verify` prints it and exits 1 on any problem. What is
checked, per stored row (`runledger.ledger.check.rowcheck`): the hash recomputed from the envelope columns and the
payload text; the payload text is canonical and valid for its kind; the typed payload columns equal
what the payload says; the event_id rule; the file's partition matches the row; per file, the digest
of the ledger's own columns. Per (run_id, producer, attempt) (`runledger.ledger.check.chainwalk`): seqs gapless from 0
and each prev_hash equal to the previous event's hash. Across the ledger: no event stored twice.
Quarantined input is counted and summarised (it is not a problem of the ledger: it was refused and kept).
Per chain: at most one `run_started` (two are two starts that shared one attempt). Every blob a `media`
event names (`{root}/media/{sha256}`, `runledger.ledger.storage.media`) is there, a plain file, and its bytes'
SHA-256 is its name: the blobs are hashed on every verify, `since` or not. Every signed chain head
(`runledger.ledger.check.signed`): its vouch and signature, that it signs the stored chain, and no event of a
finished chain after its last head; chains without heads are counted as unsigned (a problem with
`require_signed`), and the user keys that vouched for them named (or held to `trusted`). Every stored
`attestation` of a model checkpoint (`runledger.ledger.check.attested`: what `runledger attest verify` checks,
with the check the caller gives: the CLI's) whose folder is at hand; said only when the root holds one.

The table other engines read is the table verified: a delete file in the snapshot (which the ledger
never writes, and Iceberg engines apply), a manifest entry whose row count or partition is not its
file's (engines count and prune by them), a column whose field id is not the table's (engines match
columns by id, DuckDB by name) are problems. A folder that is not a ledger root is refused
(`paths.NotALedger`), not verified as an empty ledger.

Conflicts are problems too: a different event that came under a stored event_id is in quarantine
(two producers wrote one chain), so the stored chain is not the whole story.

Truncation: every chain must reach the head the ledger recorded for it (`runledger.ledger.storage.heads`), so a chain
whose tail was removed, a chain removed whole, or a run's folder deleted is a problem too. Except
exactly what a stored tombstone covers (`runledger delete`: `runledger.ledger.storage.removal`): a chain
gone up to the seq and hash the tombstone names is accepted, and the report names the tombstone;
anything past it, or gone without a tombstone, is still a problem.

Streaming: the rows are checked a batch at a time, in parts of files (row groups) spread over
processes (`jobs`, forked from a server that imported the checks once; the largest files first). Each
process reads its own files with Arrow's threads off (the processes are the parallelism) and hands back
its findings and a summary of the part's link columns (`chainwalk.Summary`: runs of one chain's
consecutive seqs, linked inside), from which each run's chains are linked once all its parts are in,
so every byte is read once. A run whose chains are interleaved row by row (too many segments to hand
on) is walked from its files in stream order instead. Memory is a few batches per process, and the
segments of the runs in progress, whatever the number of events.

Incremental (`since`, `runledger.ledger.check.verified`): a verify that passed can record what it checked (each
file's SHA-256 and rows, each chain's last seq and hash); the next one checks only the files added
since, whose events must continue the recorded chains. A file checked before must still have the
bytes it had (hashed, at disk speed); a run whose checked files changed or went (compaction rewrites
files) is verified whole again, and its chains must still pass through the heads recorded then.

`repair(root)` (`runledger verify --repair`) removes second copies of events stored twice with
identical content (two ledgers on one root, before the root lock), keeping the first; copies that
differ are left and reported.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from collections import Counter
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq

from runledger.ledger.check import attested, chainwalk, rowcheck, verified, workers
from runledger.ledger.check import signed as signed_heads
from runledger.ledger.storage import heads, locks, media, paths, recovery, streams
from runledger.ledger.storage.compaction import drop_identical_duplicates
from runledger.ledger.storage.reads import CONFLICT, read_events, stored_conflicts, stray_files
from runledger.ledger.contract.events import KINDS, make_event_id
from runledger.ledger.storage import objects
from runledger.ledger.storage.objects import source
from runledger.ledger.tlog import chainheads

MAX_LISTED = 50
PART_ROWS = 1 << 20  # rows of one unit of work (whole row groups): enough to pay for handing it to a process
PARALLEL_MIN_ROWS = 200_000  # below it, starting processes costs more than it saves
SEGMENTS_HELD = 262_144  # chain segments kept for the runs not yet linked (~0.6 KB each: ~160 MB)

Progress = Callable[[int, int], None]  # (rows done, rows in all): both the rows checked and the rows walked


@dataclass
class Report:
    events: int = 0
    files: int = 0
    chains: int = 0
    problems: list[str] = field(default_factory=list)
    quarantined: int = 0
    quarantine_reasons: Counter = field(default_factory=Counter)
    heads: dict[str, dict] = field(default_factory=dict)  # "run:producer:attempt" -> the recorded head (seq, hash)
    tombstones: list[str] = field(default_factory=list)  # what is missing because a tombstone covers it, one line each
    checked: int = 0  # events read and checked this time (all of them, unless `since`)
    checked_files: int = 0
    since: str | None = None  # when the verify this one continued was done
    record: verified.Record | None = field(default=None, repr=False)  # what this one checked, if it passed
    signed: signed_heads.Signed | None = None  # the chains' signed heads
    attested: attested.Attested | None = None  # the model checkpoints' attestations

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        return {"ok": self.ok, "events": self.events, "files": self.files, "chains": self.chains,
                "quarantined": self.quarantined, "problems": self.problems, "heads": self.heads,
                "tombstones": self.tombstones,
                "checked_events": self.checked, "checked_files": self.checked_files, "since": self.since,
                **(self.signed.summary() if self.signed else {}),
                **(self.attested.summary() if self.attested and self.attested.any else {})}

    def text(self) -> str:
        lines = [f"{self.events} events in {self.files} files, {self.chains} chains; "
                 f"{self.quarantined} quarantined messages"]
        if self.since is not None:
            lines.append(f"checked {self.checked} events in {self.checked_files} files new or changed since the "
                         f"verify of {self.since}")
        for reason, n in self.quarantine_reasons.most_common(10):
            lines.append(f"  quarantine: {n} × {reason}")
        lines += [f"  deleted: {t}" for t in self.tombstones]
        if self.signed is not None:
            lines.append(self.signed.text())
        if self.attested is not None and self.attested.any:
            lines.append(self.attested.text())
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s):")
            lines += [f"  - {p}" for p in self.problems[:MAX_LISTED]]
            if len(self.problems) > MAX_LISTED:
                lines.append(f"  … and {len(self.problems) - MAX_LISTED} more")
        else:
            lines.append("ok: every hash, chain and typed column checks out"
                         + (f"; missing only what {len(self.tombstones)} tombstone(s) cover" if self.tombstones else ""))
        return "\n".join(lines)


VERIFY_TRIES = 5  # a live ledger may compact or write while verify reads: read again, up to this often


def _files_now(root: Path) -> list[tuple[str, int]] | None:
    """The files verify reads, with their mtimes (None if one vanished while looking)."""
    files = [*paths.event_files(root), *paths.quarantine_files(root), *heads.files(root)]
    try:
        return [(str(p), p.stat().st_mtime_ns) for p in files]
    except FileNotFoundError:
        return None


def verify(root: str | Path, since: verified.Record | None = None, jobs: int | None = None,
           progress: Progress | None = None, record: bool = False, snapshot: int | None = None,
           assume_unchanged: bool = False, require_signed: bool = False, trusted: set[str] | None = None,
           attestations: attested.Check | None = None) -> Report:
    """Check a root (see the module docstring); with `since`, only what was added after that record.
    With `record`, a report that passes carries what a later `since` starts from (`report.record`;
    every file checked is hashed too). `jobs`: processes checking rows (default: the cores usable).
    A ledger serving it may compact or write meanwhile: a read whose files changed under it is done
    again (VERIFY_TRIES), so a file compacted away is never reported as a chain cut short.
    `snapshot`: check ledger snapshot N (see `runledger.ledger.storage.paths.Cut`; raises paths.SnapshotGone if it
    expired), not the current one; its chains cannot be held to the heads recorded since, so the
    heads are not checked then. `assume_unchanged` (with `since`): a file checked before whose size and
    mtime are as recorded is not read again (its bytes are not hashed): a check that costs only what is
    new, which an edit that keeps a file's size and restores its mtime gets past. `require_signed`: a chain
    without a signed head is a problem; `trusted`: the user keys a chain head may be vouched for by;
    `attestations`: the check of the stored checkpoint attestations (`runledger.ledger.attest.check_stored`, with
    its keys: a layer above, so handed in; None: they are counted as unchecked)."""
    root = Path(root)
    paths.check_root(root)
    jobs = jobs or len(os.sched_getaffinity(0))
    report = Report()
    if snapshot is not None:
        if not paths.is_tables(root):
            raise paths.SnapshotGone(f"{root} keeps no snapshots: nothing is stored there yet")
        return _verify_once(root, since, jobs, progress, record, paths.cut(root, snapshot), assume_unchanged,
                            require_signed, trusted, attestations)
    for _ in range(VERIFY_TRIES):
        before = _files_now(root)
        report = _verify_once(root, since, jobs, progress, record, assume_unchanged=assume_unchanged,
                              require_signed=require_signed, trusted=trusted, attestations=attestations)
        if before is not None and before == _files_now(root):
            break
    return report


@dataclass
class _Plan:
    """What one verify reads: the files whose rows it checks, the runs whose chains it walks whole and
    those it walks from the recorded point on (`since`)."""

    files: list[Path]  # every events file there is
    to_check: list[Path]  # the files whose rows are checked (all, or those new or changed since)
    whole_runs: set[str]  # runs whose chains are walked from seq 0
    unchanged_rows: int = 0  # rows of the files checked before and unchanged
    sha256: dict[Path, str] = field(default_factory=dict)  # of the files checked before and unchanged


def _run_of(path: Path) -> str:
    return path.parent.name.removeprefix("run_id=")


def _kind_of(path: Path) -> str:
    return path.parent.parent.name.removeprefix("kind=")


def _plan(root: Path, files: list[Path], since: verified.Record | None, recorded: dict, jobs: int,
          report: Report, assume_unchanged: bool = False) -> _Plan:
    runs = {_run_of(f) for f in files}
    if since is None:
        return _Plan(files, files, runs)
    plan = _Plan(files, [], set())
    before = {name: f for name, f in since.files.items()}
    now = {verified.name_of(root, f): f for f in files}
    kept = [n for n in before if n in now]
    sums = {n: before[n].sha256 for n in kept if assume_unchanged and before[n].size is not None
            and (before[n].size, before[n].mtime_ns) == _size_and_mtime(now[n])}
    again = [n for n in kept if n not in sums]
    with ThreadPoolExecutor(jobs) as pool:  # hashlib lets go of the GIL: the old files are hashed in parallel
        sums.update(zip(again, pool.map(rowcheck.file_sha256, [now[n] for n in again])))
    for name, old in before.items():
        run = name.split("/")[2].removeprefix("run_id=") if name.count("/") >= 3 else None
        if name not in now:
            plan.whole_runs.add(run)  # compacted away, or removed: that run is walked whole again
        elif sums[name] != old.sha256:
            report.problems.append(f"{now[name]}: changed since it was verified ({since.written_at})")
            plan.whole_runs.add(run)
        else:
            plan.sha256[now[name]] = old.sha256
            plan.unchanged_rows += old.rows
    for run_id, chains in recorded.items():  # a head recorded below the point verified: walk that run whole
        for (producer, attempt), (seq, _) in chains.items():
            end = since.chains.get((run_id, producer, attempt))
            if end is not None and seq < end[0]:
                plan.whole_runs.add(run_id)
    plan.whole_runs |= runs - {key[0] for key in since.chains}  # runs new since
    plan.to_check = [f for f in files if f not in plan.sha256 or _run_of(f) in plan.whole_runs]
    plan.unchanged_rows -= sum(since.files[verified.name_of(root, f)].rows for f in files
                               if f in plan.sha256 and _run_of(f) in plan.whole_runs)
    return plan


def _parts(path: Path) -> list[list[int]]:
    """The row groups of a file in units of about PART_ROWS rows ([[]] if it cannot be read: the
    check of its first part then says so)."""
    try:
        meta = pq.ParquetFile(source(path)).metadata
    except (OSError, ValueError):
        return [[]]
    parts, rows = [[]], 0
    for g in range(meta.num_row_groups):
        if parts[-1] and rows + meta.row_group(g).num_rows > PART_ROWS:
            parts.append([])
            rows = 0
        parts[-1].append(g)
        rows += meta.row_group(g).num_rows
    return parts


def _size_and_mtime(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _file_size(path: str) -> int:
    try:
        return objects.as_path(path).stat().st_size if objects.is_object(path) else os.path.getsize(path)
    except OSError:
        return 0


def _file_rows(path: Path) -> int:
    try:
        return pq.ParquetFile(source(path)).metadata.num_rows
    except (OSError, ValueError):
        return 0


def _verify_once(root: Path, since: verified.Record | None, jobs: int, progress: Progress | None, record: bool,
                 at: paths.Cut | None = None, assume_unchanged: bool = False, require_signed: bool = False,
                 trusted: set[str] | None = None, attestations: attested.Check | None = None) -> Report:
    report = Report(since=since.written_at if since else None)
    for path in stray_files(root):  # the views read exactly the files verify reads (paths.event_files)
        report.problems.append(f"{path}: a stray Parquet file, outside the ledger's layout (planted?)")
    for path in paths.missing_files(root, at):
        report.problems.append(f"{path}: in the tables' snapshot, but not on disk (deleted?)")
    report.problems += _read_otherwise(at or paths.cut(root))
    files = []
    for path in paths.event_files(root, at=at):
        if _kind_of(path) not in KINDS:
            report.problems.append(f"{path}: unknown kind {_kind_of(path)!r}")
        else:
            files.append(path)
    recorded, unreadable = heads.read_all(root) if heads.recorded(root) else ({}, [])
    plan = _plan(root, files, since, recorded, jobs, report, assume_unchanged)
    units = [(str(f), _kind_of(f), _run_of(f), groups, i == 0) for f in plan.to_check for i, groups in enumerate(_parts(f))]
    total = 2 * sum(_file_rows(f) for f in plan.to_check)
    done = [0]

    def advance(rows: int) -> None:
        done[0] += rows
        if progress is not None:
            progress(done[0], total)

    walk = _start_walk(plan, since, recorded)
    watched = _watched(walk)
    linking = _Linking(plan, walk, [u[2] for u in units], advance)
    parts: list[rowcheck.PartChecked | None] = [None] * len(units)
    # (files on object storage are checked in this process: the worker processes have not the warehouse's credentials)
    if jobs > 1 and total // 2 >= PARALLEL_MIN_ROWS and not any(objects.is_object(u[0]) for u in units):
        # the largest files first, so that no process is left with a large one at the end; the parts
        # are submitted from a thread, as starting the processes waits for them, and taking the
        # results need not
        largest_first = sorted(range(len(units)), key=lambda k: -_file_size(units[k][0]))
        finished: queue.SimpleQueue = queue.SimpleQueue()  # k of each part checked, or the error that stopped submitting
        with ProcessPoolExecutor(jobs, mp_context=workers.context()) as pool:
            futures: dict[int, Future] = {}

            def submit() -> None:
                try:
                    for k in largest_first:
                        futures[k] = pool.submit(rowcheck.check_part, *units[k], hash_bytes=record,
                                                 watch=watched.get(units[k][2]))
                        futures[k].add_done_callback(lambda _, k=k: finished.put(k))
                except BaseException as err:  # (raised again below, in this thread)
                    finished.put(err)

            submitting = threading.Thread(target=submit, name="verify-submit")
            submitting.start()
            try:
                for _ in units:
                    k = finished.get()
                    if isinstance(k, BaseException):
                        raise k
                    parts[k] = futures[k].result()
                    advance(parts[k].rows)
                    linking.add(k, parts[k])
            finally:
                submitting.join()
    else:
        for k, u in enumerate(units):
            parts[k] = rowcheck.check_part(*u, hash_bytes=record, watch=watched.get(u[2]))
            advance(parts[k].rows)
            linking.add(k, parts[k])
    walk.finish()
    for part in parts:
        report.problems += part.problems
    report.problems += walk.problems()
    report.problems += _rechecked(root, walk)
    report.problems += _started_twice([f for f in files if _kind_of(f) == "run_started"])
    report.problems += media.problems(root, [f for f in files if _kind_of(f) == "media"])  # every blob named, hashed
    report.signed = signed_heads.check_signed([f for f in files if _kind_of(f) == chainheads.KIND],
                                              [f for f in files if _kind_of(f) == "run_finished"],
                                              {key: c.next_seq - 1 for key, c in walk.chains.items() if c.max_seq >= 0},
                                              trusted, require_signed)
    report.problems += report.signed.problems
    report.attested = attested.check_attested([f for f in files if _kind_of(f) == "attestation"], root, attestations)
    report.problems += report.attested.problems
    if at is None:  # (a past snapshot's chains cannot be held to the heads recorded since)
        _check_heads(root, walk, recorded, unreadable, since, plan, report)
    for (run_id, producer, attempt), seqs in sorted(stored_conflicts(root, at).items()):
        for seq in sorted(seqs):
            report.problems.append(f"{make_event_id(run_id, producer, attempt, seq)}: a different event with this id is in "
                                   f"quarantine ({CONFLICT}: two producers on one chain?)")
    _summarise_quarantine(root, report, at)
    report.checked = sum(p.rows for p in parts)
    report.checked_files = len(plan.to_check)
    report.events = plan.unchanged_rows + report.checked
    report.files = len(files)
    report.chains = sum(1 for c in walk.chains.values() if c.max_seq >= 0)
    if report.ok and record:
        sha256 = {**plan.sha256, **{Path(p.path): p.file_sha256 for p in parts if p.file_sha256}}
        rows = {f: (since.files[verified.name_of(root, f)].rows if f in plan.sha256 else 0) for f in files}
        for p in parts:
            rows[Path(p.path)] += p.rows
        report.record = verified.Record.of(root, report.events, {f: (sha256[f], rows[f], *(_size_and_mtime(f) or (None, None)))
                                                                 for f in files},
                                           {key: (c.next_seq - 1, c.last_hash) for key, c in walk.chains.items()
                                            if c.max_seq >= 0})
    return report


def _read_otherwise(at: paths.Cut) -> list[str]:
    """What Iceberg engines read otherwise than the ledger's readers in the cut `at`: delete files,
    manifest entries whose row count or partition (what engines count and prune by) is not the file's,
    and columns whose field id (what engines match columns by) is not the table's."""
    problems = [f"{d.path}: a {d.content} delete file in table {table} (manifest {d.manifest}): Iceberg engines "
                f"drop the rows it names, and the ledger never writes one (committed by hand?)"
                for table, listed in sorted(at.deletes.items()) for d in listed]
    for table, listed in sorted(at.files.items()):
        ids = at.field_ids.get(table, {})
        for f in listed:
            try:
                with pq.ParquetFile(source(f.path)) as parquet:
                    rows, columns = parquet.metadata.num_rows, parquet.schema_arrow
            except (OSError, ValueError):
                continue  # (named as missing, or as unreadable by the row check)
            for column in columns:
                got = (column.metadata or {}).get(b"PARQUET:field_id")
                if got is not None and column.name in ids and int(got) != ids[column.name]:
                    read_as = next((n for n, i in ids.items() if i == int(got)), "no column")
                    problems.append(f"{f.path}: column {column.name!r} carries field id {int(got)}, the table's is "
                                    f"{ids[column.name]} (engines match columns by id: they read it as {read_as!r})")
            if f.rows is not None and f.rows != rows:
                problems.append(f"{f.path}: the table's manifest says {f.rows} rows, the file holds {rows} "
                                f"(engines that count from the manifests answer otherwise)")
            if table != paths.QUARANTINE and f.run_id != _run_of(f.path):
                problems.append(f"{f.path}: the table's manifest puts it in run {f.run_id!r}, its folder in run "
                                f"{_run_of(f.path)!r} (engines that prune by run read otherwise)")
    return problems


def _started_twice(files: list[Path]) -> list[str]:
    """Chains holding more than one run_started: two starts that took one attempt (read from the
    run_started files, one row per start: small)."""
    seqs: dict[tuple[str, str, int], list[int]] = {}
    for f in files:
        try:
            t = pq.read_table(source(f), columns=["run_id", "producer", "attempt", "seq"])
        except (OSError, ValueError):
            continue  # (the row check names a file that cannot be read)
        for run_id, producer, attempt, seq in zip(*(t.column(c).to_pylist() for c in t.column_names)):
            seqs.setdefault((run_id, producer, attempt), []).append(seq)
    return [f"chain {run_id}:{producer}:{attempt} holds {len(s)} run_started events (seqs "
            f"{', '.join(map(str, sorted(s)))}): two starts took one attempt"
            for (run_id, producer, attempt), s in sorted(seqs.items()) if len(s) > 1]


def _start_walk(plan: _Plan, since: verified.Record | None, recorded: dict) -> chainwalk.ChainWalk:
    """The walk before any row: the chains checked before (`since`) start at the point verified, or,
    in a run walked whole again, are watched there; the recorded heads are watched."""
    walk = chainwalk.ChainWalk()
    for key, (seq, hash_) in (since.chains.items() if since else ()):
        if key[0] in plan.whole_runs:
            walk.watch(key, seq)
        else:
            walk.start(key, seq, hash_)
    for run_id, chains in recorded.items():
        for (producer, attempt), (seq, _) in chains.items():
            walk.watch((run_id, producer, attempt), seq)
    return walk


def _watched(walk: chainwalk.ChainWalk) -> dict[str, dict[tuple[str, int], set[int]]]:
    """run -> (producer, attempt) -> the seqs whose hashes the walk is asked for (for the summarisers)."""
    out: dict[str, dict[tuple[str, int], set[int]]] = {}
    for (run_id, producer, attempt), chain in walk.chains.items():
        if chain.watch:
            out.setdefault(run_id, {})[(producer, attempt)] = set(chain.watch)
    return out


class _Linking:
    """Links each run's chains once every part of it is checked: from the parts' summaries of their
    link columns (`chainwalk.Summary`), so that nothing is read twice; or, if a part could not
    summarise its rows (chains interleaved row by row), or the runs waiting for their last parts hold
    more than SEGMENTS_HELD segments between them (then the run holding most is let go of), by walking
    the run's files in stream order."""

    def __init__(self, plan: _Plan, walk: chainwalk.ChainWalk, run_of_part: list[str], advance: Callable[[int], None]):
        self.walk, self.run_of_part, self.advance = walk, run_of_part, advance
        self.left = Counter(run_of_part)
        self.parts: dict[str, list[rowcheck.PartChecked]] = {}
        self.held: Counter = Counter()  # run -> the segments its parts' summaries hold
        self.walked: set[str] = set()  # runs to walk from their files
        self.files: dict[str, list[Path]] = {}
        for f in plan.to_check:
            self.files.setdefault(_run_of(f), []).append(f)

    def add(self, k: int, part: rowcheck.PartChecked) -> None:
        run_id = self.run_of_part[k]
        if part.links is None or part.links.segments is None:
            self.walked.add(run_id)
        if run_id in self.walked:
            part.links = None
            self.held.pop(run_id, None)
        else:
            self.held[run_id] += len(part.links.segments)
        self.parts.setdefault(run_id, []).append(part)
        while sum(self.held.values()) > SEGMENTS_HELD:
            most, _ = self.held.most_common(1)[0]
            self.walked.add(most)
            self.held.pop(most)
            for p in self.parts[most]:
                p.links = None
        self.left[run_id] -= 1
        if self.left[run_id] == 0:
            self.held.pop(run_id, None)
            self._link(run_id, self.parts.pop(run_id))

    def _link(self, run_id: str, parts: list[rowcheck.PartChecked]) -> None:
        if run_id in self.walked:
            for batch in streams.in_stream_order(self.files[run_id], [*rowcheck.LINK, "stream_seq"]):
                self.walk.take(batch)
                self.advance(batch.num_rows)
            return
        summaries = [p.links for p in parts]
        by_chain: dict[chainwalk.Key, list[chainwalk.Segment]] = {}
        for s in summaries:
            for seg in s.segments:
                by_chain.setdefault((run_id, seg.producer, seg.attempt), []).append(seg)
        for key in sorted(by_chain):
            self.walk.take_sorted(key, sorted(by_chain[key], key=lambda seg: (seg.first, seg.stream_seq)))
        for s in summaries:
            self.walk.take_seen(s)
        self.advance(sum(p.rows for p in parts))


def _rechecked(root: Path, walk: chainwalk.ChainWalk) -> list[str]:
    """The exact check of the chains the walk could not settle (stored far out of order): each read whole."""
    problems = []
    for key, chain in sorted(walk.chains.items()):
        if not chain.recheck:
            continue
        table = read_events(root, run_id=key[0], columns=list(rowcheck.LINK)).to_pylist()
        links = [(r["seq"], r["prev_hash"], r["hash"], r["event_id"]) for r in table
                 if (r["run_id"], r["producer"], r["attempt"]) == key and None not in r.values()]
        copies, broken = chainwalk.sorted_check(key, links)
        problems += copies + broken
    return problems


def _check_heads(root: Path, walk: chainwalk.ChainWalk, recorded: dict, unreadable: list[str],
                 since: verified.Record | None, plan: _Plan, report: Report) -> None:
    """Every chain reaches the head the ledger recorded for it (see runledger.ledger.storage.heads): its tail, the whole
    chain, or the whole run cannot be gone unnoticed; and, with `since`, the head verified before."""
    stored = {key: c for key, c in walk.chains.items() if c.max_seq >= 0}
    runs = {key[0] for key in stored}
    if not heads.recorded(root):
        if runs:
            report.problems.append(f"{root}: no chain heads recorded ({heads.HEADS_DIR}/ is missing), so a chain cut short "
                                   "cannot be found; a root from before heads were recorded gets them when a ledger "
                                   "next serves it")
        return
    report.problems += unreadable
    gone = _tombstoned(root, report)
    for run_id in sorted(runs - recorded.keys()):
        where = heads.run_file(root, run_id)
        if not where.exists():
            shown = where.relative_to(root) if isinstance(where, Path) else where  # (or in the bucket)
            report.problems.append(f"run {run_id}: events are stored but no chain heads are recorded for it "
                                   f"({shown} is missing)")
    for run_id, chains in sorted(recorded.items()):
        for (producer, attempt), (seq, h) in sorted(chains.items()):
            key, chain = (run_id, producer, attempt), f"{run_id}:{producer}:{attempt}"
            have = stored.get(key)
            if have is None and _covers(gone.get(key), seq, h):
                continue
            if have is None:
                report.problems.append(f"chain {chain}: the ledger stored it up to seq {seq}, but none of it is here "
                                       "(deleted?)")
            elif walk.hash_at(key, seq) is None:
                report.problems.append(f"chain {chain}: the ledger stored it up to seq {seq}, but it ends at seq "
                                       f"{have.max_seq} here (cut short?)")
            elif walk.hash_at(key, seq) != h:
                report.problems.append(f"{make_event_id(run_id, producer, attempt, seq)}: its hash is not the one the ledger "
                                       f"recorded as the head of {chain} (replaced?)")
    for key, (seq, h) in sorted(since.chains.items() if since else ()):
        if key[0] not in plan.whole_runs:
            continue
        at, chain = walk.hash_at(key, seq), ":".join(map(str, key))
        if at is None and key not in stored and _covers(gone.get(key), seq, h):
            continue
        if at is None:
            report.problems.append(f"chain {chain}: verified up to seq {seq} before ({since.written_at}), but it does "
                                   f"not reach it now (cut short since?)")
        elif at != h:
            report.problems.append(f"{make_event_id(*key, seq)}: its hash is not the one verified before "
                                   f"({since.written_at}) as the head of {chain} (replaced since?)")
    report.heads = {f"{run}:{p}:{a}": {"seq": s, "hash": h}
                    for run, chains in recorded.items() for (p, a), (s, h) in chains.items()}


def _tombstoned(root: Path, report: Report) -> dict[tuple[str, str, int], tuple[int, str]]:
    """(run_id, producer, attempt) -> (seq, hash): the chains stored tombstones cover; each tombstone named in
    `report.tombstones`. Only a person's tombstone counts (producer `cli`: the ledger quarantines any other)."""
    from runledger.ledger.contract.roles import is_person
    from runledger.ledger.storage import removal

    out: dict[tuple[str, str, int], tuple[int, str]] = {}
    for t in removal.stored_tombstones(root):
        if not is_person(t["producer"]):
            report.problems.append(f"{t['event_id']}: a tombstone from {t['producer']!r}, not a person's; not honoured")
            continue
        chains = removal.covered(t["payload"])
        for (producer, attempt), head in chains.items():
            out[(t["run_id"], producer, attempt)] = max(head, out.get((t["run_id"], producer, attempt), head))
        p = t["payload"]
        report.tombstones.append(f"run {t['run_id']}: tombstone {t['event_id']} by {p['by']} ({p['authority']}) at "
                                 f"{t['time']}: {p['events']} events in {len(chains)} chains, removed as it says")
    return out


def _covers(covered: tuple[int, str] | None, seq: int, h: str) -> bool:
    """Whether a tombstone's (seq, hash) of a chain covers its recorded head (seq, h): up to it, the same event."""
    return covered is not None and (covered[0] > seq or covered == (seq, h))


def _summarise_quarantine(root: Path, report: Report, at: paths.Cut | None) -> None:
    for f in paths.quarantine_files(root, at=at):
        try:
            t = pq.read_table(source(f), columns=["reason"])
        except (OSError, ValueError) as err:
            report.problems.append(f"{f}: cannot be read ({str(err).splitlines()[0][:200]})")
            continue
        report.quarantined += t.num_rows
        report.quarantine_reasons.update(re.sub(r"\d+", "N", r)[:90] for r in t.column(0).to_pylist())


def repair(root: str | Path) -> tuple[dict[str, int], list[str]]:
    """Remove the extra copies of events stored more than once with identical content; keep the first.
    Holds the root's lock, so no ledger writes meanwhile (raises locks.Busy if one serves the root).
    Returns ({event_id: copies removed}, [event_ids stored more than once with different content])."""
    root = Path(root)
    removed: Counter = Counter()
    differing: list[str] = []
    with locks.hold(root / "ledger.lock", f"ledger root {root}"):
        recovery.recover(root)
        for part in sorted((root / "events").glob("kind=*/run_id=*")):
            gone, left = drop_identical_duplicates(part)
            removed.update(gone)
            differing += left
    return dict(removed), differing
