"""The ledger service: JetStream → validated, deduplicated, durable Parquet, exactly once.

One loop (`runledger ledger serve`): fetch a batch from the durable pull consumer `ledger`, validate
every event (`runledger.ledger.contract.validation.check_envelope`), drop the ones already stored (by event_id: the stored
set is rebuilt from the tables' current snapshot at start, so a crash between write and ack stores
nothing twice), write the rest and the rejected input (to quarantine, with raw bytes, subject and
reason) atomically, commit the files to the tables, and only then ack. A batch that drains the
stream is committed at once; while full batches keep coming, a commit takes those that came within
COMMIT_EVERY_S of the first, so that an ack waits well under a second either way. A
write or commit that fails (a full disk) is retried without acking; the service keeps running and
says so. SIGTERM/SIGINT: finish and commit the batch in hand, drain, exit 0.

One ledger per root: `serve` holds the root's lock ({root}/ledger.lock, released by the OS when the
process dies), and its durable consumer carries the root's id, so neither a second ledger on the same
root nor a second root on the same consumer can take messages the other has written but not acked.
With `ledger serve --partitions K` (runledger.ledger.ingest.partitions) several instances share a root instead, each
partition written by one `Ledger` at a time (its lease in JetStream KV), with its own position and
recovery; this loop is the same for both.

While it serves, the ledger looks at its consumer and its stream every WATCH_EVERY_S (`Watch`): a
consumer deleted, or made anew by someone else (delivering only new messages, or starting past what
is stored), is said loudly and made again from the root's stored position, so that nothing is
skipped and nothing stored twice (so is one whose deliveries to this ledger were lost on the way,
a node killed mid-pull: nothing past them is written first); a stream purged, deleted or made anew
stops the ledger with one line (`StreamLost`, exit 2 from the CLI), recorded in the root (HALTED) so that no ledger serves it
again until a person decides (a silent skip, or a supervisor's restart loop, is what this prevents).

Producers ask the ledger about their chains ({LEDGER_API}.chains.{run_id}.{producer}): how far it has
acked the stream, how far each attempt's chain is stored, and the seqs at which a different event came
under a stored event_id (a conflict: two producers on one chain), so that neither is told "delivered".
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import socket
import time
from collections import deque
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path

from nats.js.errors import NotFoundError

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.storage import heads, index, locks, reads, relays, store, streampos
from runledger.ledger.storage import leaves, removal
from runledger.ledger.storage.compaction import compact_partition
from runledger.ledger.storage.positions import root_id, taken_upto
from runledger.ledger.storage.rows import Rows, StoredEvent, events_table, group_events
from runledger.ledger.storage.paths import HALTED_FILE, QUARANTINE
from runledger.ledger.ingest.batch import check_batch
from runledger.ledger.contract.canonical import envelope_text, orjson
from runledger.ledger.contract.events import (MAX_EVENT_BYTES, RELAY, STREAM, SUBJECT_PREFIX, InvalidEvent,
                                              subject_for)
from runledger.ledger.bus import consumers, retention
from runledger.ledger.bus.consumers import consumer_seq, pending_after, serve_chain_status
from runledger.ledger.ingest.position import DURABLE, LedgerPosition, Position
from runledger.ledger.contract.parsing import RefusedEntry, parse_batch_entries, parse_json
from runledger.ledger.contract.roles import is_person
from runledger.ledger.storage.reads import CONFLICT
from runledger.ledger.storage.store import Quarantined
from runledger.ledger.tlog import log as tlog
from runledger.ledger.contract.validation import check_envelope, payloads_valid

log = logging.getLogger(__name__)

FETCH_BATCH = 2_000
FETCH_TIMEOUT_S = 0.5
COMPACT_BUSY_FILES = 64  # while busy, a partition is compacted once this many new files are in it
IO_RETRIES = 5  # a batch that fails this often on I/O not of the disk is taken a message at a time
MAX_BATCH_ENTRIES = 10_000  # envelopes in one batch message (an Emitter sends at most 1,000); past it: one quarantine row
COMMIT_EVERY_S = 0.2  # while full batches keep coming, what they wrote is committed (and acked) this often
EXPIRE_EVERY_S = 60.0  # when idle, this often: snapshots past tables.KEEP_SNAPSHOTS expire, files past RETENTION_S go
WATCH_EVERY_S = 2.0  # while serving, this often: is the consumer still this root's, the stream still the one it fed?
HALTED = HALTED_FILE  # in the root: the one line saying why its ledger stopped for good (see StreamLost)


@dataclass
class Counters:
    messages: int = 0
    stored: int = 0
    duplicates: int = 0
    skipped: int = 0  # redelivered at or below the position the tables' commit records: no lookup needed
    deleted: int = 0  # a deleted run's events come again (replayed, resent): a stored tombstone covers them
    quarantined: int = 0
    write_retries: int = 0
    compactions: int = 0
    commits: int = 0
    pruned: int = 0  # stream messages let go once every durable consumer had acked them (runledger.ledger.bus.retention)
    pruned_to: int = 0  # the stream seq this ledger's last prune kept from (its own purges are not another's)
    # the last commits' waits: seconds from the arrival of a commit's first batch to its ack
    ack_waits: deque = field(default_factory=lambda: deque(maxlen=10_000), repr=False)
    # the last commits' own time: the files into the tables, the heads, the position (Ledger.commit)
    commit_s: deque = field(default_factory=lambda: deque(maxlen=10_000), repr=False)

    def line(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.__dict__.items() if not isinstance(v, deque))


@dataclass
class Decoded:
    """What one batch of messages turned into, and how much of it is written already (a write that
    failed halfway, on a full disk say, is retried from where it stopped: nothing is written twice)."""

    events: list[StoredEvent] = field(default_factory=list)
    # plain batches, taken whole (see plain_batch): (envelopes, payload texts, stream seq)
    batches: list[tuple[list[dict], list[str], int]] = field(default_factory=list)
    rejected: list[Quarantined] = field(default_factory=list)
    written_groups: set[tuple[str, str]] = field(default_factory=set)
    quarantine_written: bool = False
    unwritable: set[str] = field(default_factory=set)  # event_ids its columns could not hold: quarantined


def _entry_bytes(entry, data: bytes) -> bytes:
    """One batch entry written back alone, for the quarantine (an entry refused by the parse: its own
    bytes); the whole message if it cannot be (an entry nested deeper than Python writes, say: writing
    it back once raised and crash-looped the ledger)."""
    if isinstance(entry, RefusedEntry):
        return entry.raw if entry.raw is not None else data
    try:
        return json.dumps(entry, ensure_ascii=False, allow_nan=True).encode()
    except (RecursionError, ValueError, TypeError):
        return data


def decode_message(subject: str, data: bytes, stream_seq: int) -> tuple[list[tuple[dict, str]], list[Quarantined]]:
    """Validate one NATS message: ([(envelope, payload_text)], [rejected input with reasons])."""

    def reject(reason: str, raw: bytes = data, entry: str | None = None) -> Quarantined:
        return Quarantined(stream_seq, subject, reason, raw, entry)

    parts = subject.split(".")
    if len(parts) == 6 and parts[3] == RELAY:  # relayed (`runledger push`): runledger.<run>.<kind>.relay.<relay>.<from>
        parts = parts[:3]
    if len(parts) != 3 or parts[0] != SUBJECT_PREFIX:
        return [], [reject(f"subject {subject!r} is not runledger.<run_id>.<kind>")]
    _, run_id, subject_kind = parts
    is_batch = data[:1] == b"["  # a JSON array of envelopes of the subject's kind
    if not is_batch and len(data) > MAX_EVENT_BYTES:
        return [], [reject(f"event of {len(data):,} bytes exceeds the {MAX_EVENT_BYTES:,}-byte limit")]
    try:
        obj = parse_json(data)
    except InvalidEvent as err:
        if not is_batch:
            return [], [reject(str(err))]
        try:  # one entry may be at fault (not UTF-8, cut short, ...): refuse it alone, and take its siblings
            obj = parse_batch_entries(data)
        except InvalidEvent:
            return [], [reject(str(err))]
    if is_batch and not obj:
        return [], [reject("an empty batch: a JSON array with no envelopes")]
    if is_batch and isinstance(obj, list) and len(obj) > MAX_BATCH_ENTRIES:
        return [], [reject(f"a batch of {len(obj):,} entries exceeds the {MAX_BATCH_ENTRIES:,}-entry limit")]
    good, bad = [], []
    # a batch's payloads are validated in one call; if any is invalid, each is checked alone for its reason
    checked = (is_batch and isinstance(obj, list)
               and all(type(e) is dict and e.get("kind") == subject_kind and "payload" in e for e in obj)
               and payloads_valid(subject_kind, [e["payload"] for e in obj]))
    for i, env in enumerate(obj if is_batch else [obj]):
        try:
            if isinstance(env, InvalidEvent):  # (refused by the parse, see parse_batch_entries)
                raise env
            payload_text = check_envelope(env, parsed=True, payload_checked=checked)
            if is_batch and len(payload_text) > MAX_EVENT_BYTES:
                raise InvalidEvent(f"event payload of {len(payload_text):,} bytes exceeds the {MAX_EVENT_BYTES:,}-byte limit")
            if env["run_id"] != run_id:
                raise InvalidEvent(f"subject says run {run_id!r} but the event is for run {env['run_id']!r}")
            if env["kind"] != subject_kind:
                raise InvalidEvent(f"subject says kind {subject_kind!r} but the event is a {env['kind']!r}")
            good.append((env, payload_text))
        except Exception as err:  # (a bug on one entry costs that entry, not its siblings)
            if not isinstance(err, InvalidEvent):
                if not is_batch:
                    raise
                log.exception("the ledger failed on entry %d of message %d (%s); quarantining it", i, stream_seq, subject)
                err = f"the ledger failed on this entry: {_error_line(err)}"
            eid = env.get("event_id") if isinstance(env, dict) and isinstance(env.get("event_id"), str) else None
            if not is_batch:
                bad.append(reject(str(err), data, eid))
            else:  # keep this entry alone, as JSON text (the batch's bytes are in the stream)
                bad.append(reject(f"batch entry {i}: {err}", _entry_bytes(env, data), eid or str(i)))
    return good, bad


def plain_batch(subject: str, data: bytes) -> tuple[list[dict], list[str]] | None:
    """A batch message in the plain form that `check_batch` checks at once, all valid: (envelopes,
    payload texts); None for anything else (which `decode_message` then takes an event at a time)."""
    if data[:1] != b"[" or orjson is None:
        return None
    parts = subject.split(".")
    if len(parts) != 3 or parts[0] != SUBJECT_PREFIX:
        return None
    try:
        envs = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(envs, list) or len(envs) > MAX_BATCH_ENTRIES:
        return None
    try:
        texts = check_batch(data, envs, parts[1], parts[2])
    except Exception:  # a bug here must not stop the ledger: the path an event at a time decides
        log.exception("check_batch failed on a message of %s; taking it an event at a time", subject)
        return None
    if texts is None or max(map(len, texts)) > MAX_EVENT_BYTES:
        return None
    return envs, texts


class Fenced(RuntimeError):
    """A partition's writer whose lease may have lapsed: it must not commit (see runledger.ledger.ingest.partitions)."""


class Ledger:
    """The service's state: the root, what is stored, and the counters; one writer, given its `position`
    (runledger.ledger.ingest.position: the single ledger's by default, or a partition's, see
    runledger.ledger.ingest.partitions), whose recovery and position it keeps. With `fence`, `fence()`
    must be true for a commit to go ahead."""

    def __init__(self, root: str | Path, position: Position | None = None, fence=None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.position, self.fence = position or LedgerPosition(), fence
        recovered = self.position.recover(self.root)
        if any(recovered.values()):
            log.info("recovered root %s: %s", self.root, recovered)
        self.tables = store.tables_of(self.root)
        self.quarantined = reads.stored_quarantine_seqs(self.root)
        self.conflicts = reads.stored_conflicts(self.root)  # (run_id, producer, attempt) -> seqs that clashed
        # the last stream seq this root (or partition) has taken: read from the tables' commit (O(1), see
        # runledger.ledger.storage.streampos), or for tables that record none yet, from what they hold
        self.writer = streampos.writer_key(self.position)
        at = streampos.read(self.tables)
        self.expected_stream, fits = streampos.expected(self.root, at)
        self.stream_id: str | None = None  # the stream's identity, once bound (`bind_stream`)
        stored = at.seq(self.writer) if fits else 0
        if at.stream is None and not self.position.partitioned and streampos.adopted(self.root) is None:
            stored = taken_upto(self.root)
        self.taken_upto = max(self.position.load(self.root), stored)
        self.heads = self._load_heads()
        # which events are stored, per run, loaded when a message of the run comes above the position
        self.index = index.LazyIndex(self.root, self._check_heads)
        self.counters = Counters()
        self._unmerged: dict[Path, int] = {}  # partition -> files written to it since it was compacted
        self._pending: dict[str, list[Path]] = {}  # table -> files written and not yet committed
        self._heads_moved: set[str] = set()  # runs whose chain heads moved since the last commit
        self._taken = self.taken_upto  # the last stream seq written, recorded at the next commit
        self._expired_at = time.monotonic()
        self._uncertain = False  # a commit failed: some of `_pending` may be in the tables already
        self.last_commit: tuple[str, int] | None = None  # (when, ledger snapshot number) of the last commit
        self.backlog: int | None = None  # messages still pending on the consumer as of the last fetch
        self._tombstones: list[dict] = []  # tombstones written since the last commit: their runs' rows go after it
        self._relayed: dict = {}  # chains relayed since the last commit (runledger.ledger.storage.relays)
        self.deleted: dict[tuple[str, str, int], int] = {}  # chain -> the seq up to which a tombstone covers it
        tombstones = removal.stored_tombstones(self.root)
        self._note_deleted(tombstones)
        if not self.position.partitioned:  # (a partition's writer removes only what it stores: see commit)
            self._remove_deleted(tombstones)
        self.tlog = self._open_tlog()  # the transparency log, caught up with the tables
        self._unlogged: list[dict] = []  # events written whose leaves go in after their commit
        self._uncommitted = 0  # how many of them no commit took yet
        log.info("ledger root %s: stream seq %d taken (%s), %d quarantined messages", self.root, self.taken_upto,
                 self.expected_stream or "no stream recorded yet", len(self.quarantined))

    def _load_heads(self) -> dict[str, dict[heads.Chain, heads.Head]]:
        """The recorded chain heads (see runledger.ledger.storage.heads), each checked against what is stored: a head the
        root no longer reaches is kept (verify names it) and said loudly here."""
        if store.start_heads(self.root):
            log.warning("root %s recorded no chain heads: recording them from what is stored (a chain cut short "
                        "before now cannot be found)", self.root)
        recorded, unreadable = heads.read_all(self.root)
        if unreadable:
            stored = reads.stored_heads(self.root)
            for line in unreadable:
                log.error("%s; recording that run's heads anew from what is stored", line)
            for run_id in stored.keys() - recorded.keys():
                recorded[run_id] = stored[run_id]
        return recorded

    def _check_heads(self, run_id: str, idx: index.SeqIndex) -> None:
        """A run's recorded heads checked against what is stored, when its stored events are first loaded."""
        for (producer, attempt), (seq, _) in self.heads.get(run_id, {}).items():
            if (run_id, producer, attempt, seq) not in idx:
                log.error("chain %s:%s:%d: the ledger stored it up to seq %d, but the root no longer holds that "
                          "event (cut short while the ledger was down?); `runledger verify` names it",
                          run_id, producer, attempt, seq)

    def decode(self, messages: list[tuple[str, bytes, int]]) -> Decoded:
        """Validate and deduplicate a batch of (subject, data, stream_seq)."""
        out = Decoded()
        batch_hashes: dict[str, str] = {}
        maybe_dup: list[tuple[dict, str, int, str]] = []
        for subject, data, sseq in messages:
            if sseq <= self.taken_upto:  # stored (or quarantined) and committed: redelivered after a restart
                self.counters.skipped += 1
                continue
            plain = plain_batch(subject, data)
            if plain is not None and self._take_plain(out, batch_hashes, *plain, sseq):
                continue
            try:
                good, bad = decode_message(subject, data, sseq)
            except Exception as err:  # a bug on some input must not stop the ledger: keep the message, go on
                log.exception("the ledger failed on message %d (%s); quarantining it", sseq, subject)
                good, bad = [], [Quarantined(sseq, subject, f"the ledger failed on this message: {_error_line(err)}", data)]
            if sseq not in self.quarantined:
                out.rejected.extend(bad)
            if good and subject.count(".") == 5:  # relayed: who carried the chain is recorded at the commit
                relays.note(self._relayed, subject, good)
            for env, payload_text in good:
                key = (env["run_id"], env["producer"], env["attempt"], env["seq"])
                eid = env["event_id"]
                if self._deleted(key[:3], key[3]):  # never stored again (nor quarantined)
                    self.counters.deleted += 1
                elif eid in batch_hashes:
                    self._duplicate(out, batch_hashes[eid], env, subject, data, sseq)
                elif key in self.index:
                    maybe_dup.append((env, subject, sseq, data))
                else:
                    batch_hashes[eid] = env["hash"]
                    out.events.append(StoredEvent(env, payload_text, sseq))
        if maybe_dup:  # redelivered after a crash, or resent by a producer: same hash = same event
            self.commit()  # (the stored hashes are read from the tables: what this ledger wrote too)
            by_part: dict[tuple[str, str], set[str]] = {}
            for env, *_ in maybe_dup:
                by_part.setdefault((env["kind"], env["run_id"]), set()).add(env["event_id"])
            stored = {}
            for (kind, run_id), ids in by_part.items():
                stored.update(reads.stored_hashes(self.root, kind, run_id, ids))
            for env, subject, sseq, data in maybe_dup:
                self._duplicate(out, stored.get(env["event_id"]), env, subject, data, sseq)
        return out

    def _take_plain(self, out: Decoded, batch_hashes: dict[str, str], envs: list[dict], texts: list[str], sseq: int) -> bool:
        """Take a checked plain batch (one chain, consecutive seqs) whole if none of it is stored or
        earlier in this fetch; False if some is (then its events are taken one at a time)."""
        first = envs[0]
        ids = [e["event_id"] for e in envs]
        chain = (first["run_id"], first["producer"], first["attempt"])
        if self._deleted(chain, first["seq"]) or not batch_hashes.keys().isdisjoint(ids) or \
                self.index.any_stored(chain, first["seq"], len(envs)):
            return False
        batch_hashes.update(zip(ids, [e["hash"] for e in envs]))
        out.batches.append((envs, texts, sseq))
        return True

    def _duplicate(self, out: Decoded, stored_hash: str | None, env: dict, subject: str, data: bytes, sseq: int) -> None:
        if stored_hash == env["hash"]:
            self.counters.duplicates += 1
            return
        self.conflicts.setdefault((env["run_id"], env["producer"], env["attempt"]), set()).add(env["seq"])
        if sseq not in self.quarantined:
            out.rejected.append(Quarantined(
                sseq, subject, f"event_id {env['event_id']} is already stored with a different hash ({CONFLICT})",
                json.dumps(env).encode(), env["event_id"]))

    def chain_status(self, run_id: str, producer: str) -> dict:
        """What a producer asks: per attempt of (run_id, producer), the seqs stored gaplessly from 0
        (`stored_upto`) and the seqs where a conflicting event came."""
        chains = {}
        self.index.load_run(run_id)
        for (run, prod, attempt), (upto, _) in self.index.chains.items():
            if run == run_id and prod == producer:
                chains[str(attempt)] = {"stored_upto": upto, "conflicts": []}
        for (run, prod, attempt), seqs in self.conflicts.items():
            if run == run_id and prod == producer:
                chains.setdefault(str(attempt), {"stored_upto": 0})["conflicts"] = sorted(seqs)
        return {"chains": chains}

    def write(self, decoded: Decoded) -> None:
        """Durably write a decoded batch, remembering each file as it lands. Raises OSError on failure;
        calling it again with the same `decoded` writes only what is missing."""
        now = datetime.now(timezone.utc)
        parts = []
        groups = {key: Rows.of(group) for key, group in group_events(decoded.events).items()}
        for envs, texts, sseq in decoded.batches:
            rows = groups.setdefault((envs[0]["kind"], envs[0]["run_id"]), Rows())
            rows.envs.extend(envs)
            rows.payload_texts.extend(texts)
            rows.stream_seqs.extend([sseq] * len(envs))
        for (kind, run_id), rows in groups.items():
            if (kind, run_id) in decoded.written_groups:
                continue
            if decoded.unwritable:
                rows = _without(rows, decoded.unwritable)
            try:
                path = store.write_group(self.root, kind, run_id, rows, now, self.tables)
            except OSError:
                raise
            except Exception as err:  # a value its column cannot hold: quarantine that event, write the rest
                if type(err).__name__ == "CommitFailedException":  # another writer changed the table first
                    self.tables.forget(kind)  # (its cached handle is stale: loaded again on the retry)
                    raise CatalogUnavailable(errno.EIO, f"table {kind} changed meanwhile: {_error_line(err)}") from err
                _raise_if_unavailable(err)
                rows = self._set_aside_unwritable(decoded, kind, rows, now, err)
                path = store.write_group(self.root, kind, run_id, rows, now, self.tables) if rows.envs else None
            if path is not None:
                parts.append(path.parent)
                self._pending.setdefault(kind, []).append(path)
            decoded.written_groups.add((kind, run_id))
            self.counters.stored += len(rows.envs)
            self._uncommitted += len(rows.envs)
            self.index.add_all([(e["run_id"], e["producer"], e["attempt"], e["seq"]) for e in rows.envs])
            if kind == removal.TOMBSTONE:
                self._tombstones += rows.envs
                self._note_deleted(rows.envs)
            self._heads_moved |= heads.advance(self.heads, rows.envs)
            self._unlogged += rows.envs
        if decoded.rejected and not decoded.quarantine_written:
            path = store.write_quarantine(self.root, decoded.rejected, now, self.tables)
            self._pending.setdefault(QUARANTINE, []).append(path)
            decoded.quarantine_written = True
            self.quarantined.update(q.stream_seq for q in decoded.rejected)
            self.counters.quarantined += len(decoded.rejected)
            for reason in {q.reason for q in decoded.rejected[:5]}:
                log.warning("quarantined: %s", reason)
        for part in parts:  # compaction waits for a quiet moment, unless files pile up meanwhile
            if not isinstance(part, Path):  # (a bucket's partition: compaction works on local files only, so far)
                continue
            self._unmerged[part] = self._unmerged.get(part, 0) + 1
            if self._unmerged[part] >= COMPACT_BUSY_FILES:
                self._compact(part)

    def note_taken(self, stream_seq: int) -> None:
        """Messages up to `stream_seq` are written (stored or quarantined): the next commit records it."""
        self._taken = max(self._taken, stream_seq)

    def _open_tlog(self):
        """The transparency log of this ledger's position, or None: off, or refused (another key's log, or
        files that no longer give its last signed checkpoint). A refused log stops nothing: the tables
        go on storing every event, and its leaves go in from them once the log is fixed (see _tlog_refused)."""
        try:
            return tlog.for_ledger(self.root, self.position, self.tables)
        except tlog.TlogRefused as err:
            self._tlog_refused(err)
            return None

    def _tlog_refused(self, err: Exception) -> None:
        log.error("the transparency log is not extended (the tables still store every event; `runledger tlog audit` "
                  "fails until it is fixed, and the next ledger start catches its leaves up): %s", _error_line(err))
        self.tlog = None
        tlog.unfollowed(self.root, tlog.part_of(self.position))  # (before any commit without leaves)

    def _leaves_props(self) -> dict[str, str] | None:
        """The first leaf the events of the commit under way take in the log (runledger.ledger.storage.leaves):
        after the leaves of every event committed before it, appended or still to be."""
        if self.tlog is None:
            return None
        return leaves.commit_props(self.tlog.name, self.tlog.size + len(self._unlogged) - self._uncommitted)

    def commit(self) -> None:
        """Make what was written readable and record how far it goes: what must happen before an ack.
        The files go into the tables' snapshots in one commit; then the chain heads (every acked event
        is at or below a recorded head) and the position (the Position's `save`) are written.
        Raises on failure (OSError: the disk; anything else: the catalog); calling it again is safe: a
        catalog that failed mid-commit (its server killed) may have taken some files, and those are not
        committed twice. A partition's writer commits only while its lease holds (raises Fenced)."""
        if self.fence is not None and (self._pending or self._heads_moved or self._taken > self.taken_upto) \
                and not self.fence():
            raise Fenced(f"{self.position.name}: lease not held; not committing")
        started = time.perf_counter()
        if self._pending:
            if self._uncertain:
                self._pending = self._not_committed(self._pending)
            self._uncertain = True
            at = streampos.commit_props(self.writer, self._taken, self.stream_id) if self._taken else None
            first_leaf = self._leaves_props()
            if not self.position.partitioned:
                self.tables.commit(self._pending, at, first_leaf)
            else:  # several writers conflict: a table whose commit went through is not taken again
                number = None
                names = list(self._pending)
                for name in names:
                    if number is not None:
                        self.tables.commit_no = number - 1  # (one number for the tables of one commit)
                    number = self.tables.commit({name: self._pending[name]}, at if name == names[-1] else None,
                                                first_leaf)
                    del self._pending[name]
            self._uncertain = False
            self._uncommitted = 0
            self.last_commit = (datetime.now(timezone.utc).isoformat(timespec="milliseconds"), self.tables.commit_no)
            self._pending = {}
        if self.tlog is not None and self._unlogged:  # the tables hold them: their leaves, then maybe a signature
            try:
                self.tlog.append(self._unlogged)  # (all or nothing: a failure leaves them to the retried commit)
                logged, self._unlogged = self._unlogged, []
                self.tlog.maybe_sign(logged)
            except tlog.TlogRefused as err:
                self._tlog_refused(err)
                self._unlogged = []
            except OSError as err:  # (a full disk while signing: signed at a later quiet moment or commit)
                log.error("cannot sign the transparency log's checkpoint: %s", _error_line(err))
        if self._heads_moved:
            heads.write(self.root, self.heads, self._heads_moved)
            self._heads_moved = set()
        if self._relayed:
            relays.record(self.root, self._relayed, self.stream_id)
            self._relayed = {}
        if self._taken > self.taken_upto:
            self.position.save(self.root, self._taken)
            self.taken_upto = self._taken
        self.counters.commit_s.append(time.perf_counter() - started)
        if self._tombstones:
            self._remove_deleted(self._tombstones)
            self._tombstones = []

    def _note_deleted(self, tombstones: list[dict]) -> None:
        """Remember what stored tombstones cover (a person's only, as `removal.remove_covered` applies them):
        a covered event that comes again, a spool replayed or a message resent after `runledger delete`,
        is dropped, not stored anew nor quarantined with its data."""
        for t in tombstones:
            if not is_person(t["producer"]):
                continue
            for (producer, attempt), (seq, _) in removal.covered(t["payload"]).items():
                chain = (t["run_id"], producer, attempt)
                self.deleted[chain] = max(self.deleted.get(chain, -1), seq)

    def _deleted(self, chain: tuple[str, str, int], seq: int) -> bool:
        """Whether a stored tombstone covers seq `seq` of `chain` (see `_note_deleted`)."""
        return seq <= self.deleted.get(chain, -1)

    def _remove_deleted(self, tombstones: list[dict]) -> None:
        """Take the rows each stored tombstone covers out of the tables (runledger.ledger.storage.removal). A
        failure is said and left: the tombstone is stored, and the next start applies it again."""
        for t in tombstones:
            try:
                removal.remove_covered(self.root, t, self.tables)
            except Exception as err:
                _raise_if_unavailable(err)
                log.error("run %s: the rows tombstone %s covers are not removed yet: %s", t["run_id"], t["event_id"],
                          _error_line(err))

    def _not_committed(self, pending: dict[str, list[Path]]) -> dict[str, list[Path]]:
        """The files of `pending` that no table's current snapshot holds (after a commit that failed)."""
        out = {}
        for name, files in pending.items():
            t = self.tables.table(name)
            t.refresh()
            snap = t.current_snapshot()
            held = self.tables.live_files(t, snap) if snap is not None else set()
            left = [f for f in files if f"file://{f}" not in held and str(f) not in held]
            if len(left) < len(files):
                log.warning("table %s: %d files of a commit that failed are in it already; not committing them again",
                            name, len(files) - len(left))
            if left:
                out[name] = left
        return out

    def write_safely(self, decoded: Decoded, messages: list[tuple[str, bytes, int]]) -> None:
        """`write`, and if it fails for any reason but the disk's (a bug on some message), the messages
        one at a time, quarantining the one at fault: no message can stop the ledger. Raises OSError."""
        try:
            self.write(decoded)
        except OSError:
            raise
        except Exception as err:
            _raise_if_unavailable(err)
            log.exception("the ledger failed writing %d messages; taking them one at a time", len(messages))
            self.write_each(messages)

    def write_each(self, messages: list[tuple[str, bytes, int]], isolate_io: bool = False) -> None:
        """Decode and write each message alone; one whose handling fails is quarantined whole with the
        reason (what a batch's failure comes down to). An OSError of the disk (full, read-only, failing)
        still raises: no valid event is ever set aside for the disk's sake. With `isolate_io`, any other
        OSError (one message's own, after the batch failed IO_RETRIES times) quarantines that message."""
        for subject, data, sseq in messages:
            try:
                self.write(self.decode([(subject, data, sseq)]))
            except OSError as err:
                if not isolate_io or _of_the_disk(err):
                    raise
                log.error("message %d (%s) cannot be written (%s); quarantining it", sseq, subject, err)
                if sseq not in self.quarantined:
                    reason = f"the ledger cannot write this message: {_error_line(err)}"
                    self.write(Decoded(rejected=[Quarantined(sseq, subject, reason, data)]))
            except Exception as err:
                _raise_if_unavailable(err)
                log.exception("the ledger failed on message %d (%s); quarantining it", sseq, subject)
                if sseq not in self.quarantined:
                    reason = f"the ledger failed on this message: {_error_line(err)}"
                    self.write(Decoded(rejected=[Quarantined(sseq, subject, reason, data)]))

    def _set_aside_unwritable(self, decoded: Decoded, kind: str, rows: Rows, now: datetime,
                              err: Exception) -> Rows:
        """The rows that can be written, one by one; the others go to quarantine with the reason."""
        log.warning("a %s group could not be written (%s); finding the events at fault", kind, _error_line(err))
        ok = Rows()
        for env, text, sseq in zip(rows.envs, rows.payload_texts, rows.stream_seqs):
            one = Rows([env], [text], [sseq])
            try:
                events_table(kind, one, now)
            except OSError:
                raise
            except Exception as why:
                decoded.unwritable.add(env["event_id"])
                decoded.rejected.append(Quarantined(sseq, subject_for(env["run_id"], kind),
                                                    f"cannot be stored: {_error_line(why)}",
                                                    envelope_text(env, text, with_hash=True).encode(), env["event_id"]))
                continue
            ok.envs.append(env)
            ok.payload_texts.append(text)
            ok.stream_seqs.append(sseq)
        return ok

    def compact_idle(self) -> None:
        """Compact the partitions written since their last compaction, and now and then expire old
        snapshots (call when there is no work, and nothing uncommitted)."""
        if self.fence is not None and not self.fence():  # (a partition's writer whose lease lapsed)
            return
        for part in list(self._unmerged):
            self._compact(part)
        if self.tlog is not None:  # a quiet moment: the last commits' checkpoint, if not signed yet
            try:
                self.tlog.sign()
            except OSError as err:  # (a full disk: signed at a later quiet moment or commit)
                log.error("cannot sign the transparency log's checkpoint: %s", _error_line(err))
            except tlog.TlogRefused as err:
                self._tlog_refused(err)
        if time.monotonic() - self._expired_at > EXPIRE_EVERY_S:
            self._expired_at = time.monotonic()
            try:
                expired, removed = self.tables.expire(), self.tables.sweep()
                if expired or removed:
                    log.info("expired %d snapshots; removed %d files no reader can need any more", expired, removed)
            except Exception as err:  # the events are safe; expiry can wait
                log.warning("snapshot expiry postponed: %s", _error_line(err))

    def _compact(self, part: Path) -> None:
        try:
            if compact_partition(part) is not None:
                self.counters.compactions += 1
            self._unmerged.pop(part, None)
        except OSError as err:  # the events are durable already; compaction can wait
            log.warning("compaction of %s postponed: %s", part, err)
        except Exception as err:  # a stored file was changed, say: never a reason to stop; verify reports it
            log.error("compaction of %s skipped: %s", part, err)
            self._unmerged.pop(part, None)


async def _commit_and_ack(ledger: Ledger, unacked: list, stop: asyncio.Event | None, since: float) -> bool:
    """Commit what `unacked` wrote, then ack it (and empty the list). A commit that fails is retried
    every second without acking; False if `stop` came first (the messages are redelivered later)."""
    while True:
        try:
            ledger.commit()
            break
        except Exception as err:  # the disk or the catalog: keep the messages, ack nothing, try again
            ledger.counters.write_retries += 1
            log.error("cannot commit to %s (%s); not acking %d messages, retrying", ledger.root, _error_line(err),
                      len(unacked))
            if stop is None:
                return False
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
                return False
            except asyncio.TimeoutError:
                continue
    for m in unacked:
        await m.ack()
    ledger.counters.messages += len(unacked)
    ledger.counters.commits += 1
    ledger.counters.ack_waits.append(time.monotonic() - since)
    unacked.clear()
    return True


class CatalogUnavailable(OSError):
    """The tables' catalog cannot be reached (a shared catalog's server is down, a sqlite catalog is
    locked), or a partition's writer is fenced: like a failing disk, a reason to wait, never to blame
    a message (an OSError with errno EIO, so `_of_the_disk` says so)."""


def _raise_if_unavailable(err: BaseException) -> None:
    """Raise CatalogUnavailable if `err` (or what caused it) is the catalog's connection, or Fenced."""
    seen = err
    while seen is not None:
        kind = type(seen)
        if isinstance(seen, Fenced) or (kind.__name__ in ("OperationalError", "InterfaceError")
                                        and kind.__module__.split(".")[0] in ("sqlalchemy", "psycopg2", "sqlite3")):
            raise CatalogUnavailable(errno.EIO, f"the catalog is unavailable: {_error_line(err)}") from err
        seen = seen.__cause__ or seen.__context__


def _of_the_disk(err: OSError) -> bool:
    """An OSError of the disk as a whole (full, over quota, read-only, failing): wait for it, never blame a message."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.ENOMEM)


def _error_line(err: BaseException) -> str:
    """An exception as one short line, for a quarantine reason."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"


def _without(rows: Rows, event_ids: set[str]) -> Rows:
    keep = [i for i, e in enumerate(rows.envs) if e["event_id"] not in event_ids]
    return Rows([rows.envs[i] for i in keep], [rows.payload_texts[i] for i in keep], [rows.stream_seqs[i] for i in keep])


def consumer_owner(root: Path) -> dict[str, str]:
    """The consumer metadata that ties a durable consumer to this root."""
    return {bus.OWNER_KEY: root_id(root), "runledger_root": str(Path(root).resolve()),
            "runledger_host": socket.gethostname()}


class StreamLost(RuntimeError):
    """The stream this root takes its events from was purged, deleted or created anew while the root
    had not taken everything in it, or its seqs are no longer the ones the root recorded: events may
    be gone, and taking on would skip them or store another stream's under the root's positions. The
    ledger stops, says why in one line, and records it ({root}/HALTED) so that no ledger serves the
    root again until a person decides (adopting a new stream deliberately is not done here)."""


def halted(root: Path) -> str | None:
    """Why the root's ledger stopped for good (see StreamLost), or None."""
    try:
        return (Path(root) / HALTED).read_text().strip() or None
    except OSError:
        return None


def halt(root: Path, reason: str) -> StreamLost:
    """Record `reason` as why the root's ledger stopped for good, log it, and return the StreamLost to raise."""
    tmp = Path(root) / f".{HALTED}.tmp"
    tmp.write_text(reason + "\n")
    os.replace(tmp, Path(root) / HALTED)
    log.error("%s", reason)
    return StreamLost(reason)


async def stream_problem(js, root: Path, taken_upto: int | None, first_seen: int | None = None,
                         created=None, stream: str = STREAM, pruned_to: int = 0) -> str | None:
    """Why `stream` is not the one the root took messages from up to stream seq `taken_upto` (purged,
    deleted, created anew), or None. `first_seen`, `created`: its first seq and creation time when the
    ledger bound to it (a purge that removed only what the root had taken shows only in those; a
    ledger's own prune, which takes only what every durable consumer acked, is not reported).
    `taken_upto` None: the seqs are not compared (a partition's position is not the stream's end).
    `pruned_to`: the seq this ledger's own last prune kept from: the ledger is the stream's one pruner
    (runledger.ledger.bus.retention), so a stream beginning past it was purged by someone else, whether
    or not the ledger had taken what went."""
    from nats.js.errors import NotFoundError

    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return f"stream {stream} was deleted while root {root} took messages from it"
    state = info.state
    if created is not None and info.created is not None and info.created != created:
        return f"stream {stream} was deleted and created anew ({info.created.isoformat()}) under the ledger of {root}"
    if taken_upto is None:
        pass
    elif state.last_seq < taken_upto:
        return (f"stream {stream} ends at seq {state.last_seq}, but root {root} took messages up to seq {taken_upto}: "
                f"it was purged or created anew, and its seqs are not the root's")
    elif state.first_seq > taken_upto + 1 and state.last_seq > taken_upto:
        return (f"stream {stream} was purged: it begins at seq {state.first_seq}, but root {root} took messages only "
                f"up to seq {taken_upto}, so seqs {taken_upto + 1}..{state.first_seq - 1} are gone")
    if first_seen is not None and state.first_seq > max(first_seen, pruned_to, 1):  # (a stream with no message yet: 0)
        return (f"stream {stream} was purged while the ledger of {root} served it (its first seq went from {first_seen} "
                f"to {state.first_seq}, past {max(first_seen, pruned_to)}, where the ledger's own prune left it)")
    return None


class Watch:
    """What a serving ledger checks every WATCH_EVERY_S and whenever a pull fails: that its streams are
    the ones it found at its first look (else StreamLost), and that its consumer is still there and
    still as it was made (else a reason to make it again from the stored position: `problem` returns
    one line). Make a new Watch after each subscribe: its first look is taken at its first check."""

    def __init__(self, js, ledger: Ledger, durable: str, consumer_stream: str = STREAM,
                 consumer_problem=None, streams: tuple[str, ...] = ()) -> None:
        self.js, self.ledger, self.durable, self.consumer_stream = js, ledger, durable, consumer_stream
        self.consumer_problem = consumer_problem or (lambda info: bus.position_problem(info, ledger.taken_upto))
        self.streams = streams  # derived streams, checked for being deleted or made anew
        self.first_seen: int | None = None
        self.created: dict[str, object] = {}
        self.consumer_created = None

    async def _first_look(self, name: str) -> None:
        from nats.js.errors import NotFoundError

        try:
            info = await self.js.stream_info(name)
        except NotFoundError:
            return
        self.created[name] = info.created
        if name == STREAM:
            self.first_seen = info.state.first_seq

    async def problem(self) -> str | None:
        """Raise StreamLost if a stream is not the one first seen; a consumer's problem in one line, or None."""
        root = self.ledger.root
        for name in (STREAM, *self.streams):
            if name not in self.created:
                await self._first_look(name)
        lost = await stream_problem(self.js, root, None if self.ledger.position.partitioned else self.ledger.taken_upto,
                                    self.first_seen, self.created.get(STREAM), pruned_to=self.ledger.counters.pruned_to)
        for name in self.streams:
            lost = lost or await stream_problem(self.js, root, None, None, self.created.get(name), stream=name)
        if lost:
            raise halt(root, lost)
        try:
            info = await self.js.consumer_info(self.consumer_stream, self.durable)
        except NotFoundError:
            return f"consumer {self.durable!r} was deleted while the ledger of {root} served it"
        if self.consumer_created is None:
            self.consumer_created = info.created
        elif info.created != self.consumer_created:
            return f"consumer {self.durable!r} was deleted and created anew while the ledger of {root} served it"
        why = self.consumer_problem(info)
        return f"consumer {self.durable!r} {why}" if why else None


async def bind_stream(js, ledger: Ledger) -> None:
    """Tie `ledger` to the stream it takes messages from: the one its tables were fed by (or adopted
    since: runledger.ledger.storage.streampos), else StreamLost with one line naming the command that
    adopts it (recorded in HALTED)."""
    found = await streampos.stream_identity(js, STREAM)
    if ledger.expected_stream is not None and found != ledger.expected_stream:
        raise halt(ledger.root, streampos.refusal(ledger.root, found, ledger.expected_stream))
    ledger.stream_id = found


async def make_consumer_from_position(js, durable: str, ledger: Ledger, replace: bool = False) -> None:
    """The root's durable consumer made from what the root stored: delivering from the stream seq after
    its position (everything, for a root that took nothing). With `replace`, one there is deleted first."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    if replace:
        try:
            await js.delete_consumer(STREAM, durable)
        except NotFoundError:
            pass
    start = ledger.taken_upto + 1
    await js.add_consumer(STREAM, ConsumerConfig(
        durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=bus.ACK_WAIT_S, max_deliver=-1,
        max_ack_pending=bus.MAX_ACK_PENDING, filter_subject=f"{SUBJECT_PREFIX}.>", metadata=consumer_owner(ledger.root),
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start > 1 else DeliverPolicy.ALL,
        opt_start_seq=start if start > 1 else None))


async def subscribe_until_ready(nats_url: str, stop: asyncio.Event, ledger: Ledger):
    """Connect, make sure of the stream and the consumer, bind to it — waiting for the server if it
    is not up yet or not ready (a cluster electing a leader). (nc, puller), or (None, None) if stopped.
    Raises bus.ConsumerTaken if the consumer belongs to another root."""
    durable = ledger.position.durable

    async def bind(nc):
        js = nc.jetstream()
        await bus.ensure_stream(js)
        await bind_stream(js, ledger)
        lost = await stream_problem(js, ledger.root, ledger.taken_upto)
        if lost:
            raise halt(ledger.root, lost)
        try:
            await js.consumer_info(STREAM, durable)
        except NotFoundError:
            if ledger.taken_upto:
                log.error("consumer %r is missing, though root %s took messages up to stream seq %d: making it "
                          "again from there", durable, ledger.root, ledger.taken_upto)
            await make_consumer_from_position(js, durable, ledger)
        await bus.ensure_consumer(js, durable, rewind=True, owner=consumer_owner(ledger.root),
                                  seen_upto=ledger.taken_upto)

        async def ack_floor() -> int:
            return (await js.consumer_info(STREAM, durable)).ack_floor.stream_seq

        await serve_chain_status(nc, ack_floor, ledger.chain_status)
        return await bus.Puller(nc, STREAM, durable).start()

    return await consumers.subscribe_until_ready(lambda: bus.connect_listening(nats_url, name="ledger"), stop, bind,
                                                 f"waiting for NATS at {nats_url}",
                                                 fatal=(bus.ConsumerTaken, StreamLost), warn_every=20)


def stopped_by_signals() -> asyncio.Event:
    """An event the running loop sets on SIGTERM or SIGINT (the ledger then commits what it holds and exits 0)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve(root: str | Path, nats_url: str, stop: asyncio.Event | None = None,
                batch: int = FETCH_BATCH, durable: str = DURABLE, until_stored: int | None = None,
                exclusive: bool = True) -> Counters:
    """Run the ledger until `stop` is set (or SIGTERM/SIGINT when `stop` is None), or until it has
    stored `until_stored` events in this run (for benches). Raises locks.Busy if another ledger serves
    `root`, bus.ConsumerTaken if `durable` is another root's, and StreamLost if the stream was purged or
    made anew (then, and ever after, one line saying so: see HALTED). (`exclusive=False` skips the root
    lock: only for tests that show what the lock prevents.)"""
    stop = stop or stopped_by_signals()  # (before the root is opened: a SIGTERM while it opens stops it cleanly too)
    Path(root).mkdir(parents=True, exist_ok=True)
    lock = locks.hold(Path(root) / "ledger.lock", f"ledger root {root}") if exclusive else None
    try:
        if halted(root):
            raise StreamLost(f"{halted(root)} (recorded in {Path(root) / HALTED}; this root is not served again)")
        return await serve_ledger(Ledger(root, LedgerPosition(durable)), nats_url, stop, batch, until_stored)
    finally:
        if lock is not None:
            lock.release()


async def serve_ledger(ledger: Ledger, nats_url: str, stop: asyncio.Event | None, batch: int = FETCH_BATCH,
                       until_stored: int | None = None, subscribe=None, watch=None, remake=None) -> Counters:
    """The loop of one writer, on its position's consumer. A partition's writer (runledger.ledger.ingest.
    partitions) passes its own `subscribe(nats_url, stop, ledger)` (the partitioned stream's consumer:
    (nc, puller), or (None, None) if stopped), `watch(js)` (its Watch) and `remake(js)` (its consumer made
    again). Raises StreamLost (see Watch)."""
    root = ledger.root
    durable = ledger.position.durable
    stop = stop or stopped_by_signals()
    subscribe = subscribe or subscribe_until_ready
    watch = watch or (lambda js: Watch(js, ledger, durable))
    remake = remake or (lambda js: make_consumer_from_position(js, durable, ledger, replace=True))
    nc, sub = await subscribe(nats_url, stop, ledger)
    if nc is None:
        return ledger.counters
    watching = watch(nc.jetstream())
    next_watch = 0.0  # (its first look now)
    log.info("ledger serving %s from %s (consumer %s)", root, nats_url, durable)
    last_report = time.monotonic()
    unacked: list = []  # messages written, waiting for their commit
    since = 0.0  # when the first of them arrived
    delivered = None  # the consumer's delivery count at the last message fetched from this subscription

    async def look() -> str | None:
        """The watch's look now: a reason to make the consumer again, or None (also when the server does
        not answer: looked at again later). StreamLost goes up, after committing what was written."""
        try:
            return await watching.problem()
        except StreamLost:
            if unacked:  # (what was written is valid: committed, never acked to a stream that is gone)
                ledger.commit()
            await nc.close()
            raise
        except Exception as err:  # the server unreachable for now: looked at again later
            log.debug("watch: %s", err)
            return None

    next_prune = 0.0
    prune_failed = ""

    async def prune() -> None:
        """Let go of the stream's messages every durable consumer has acked (see retention), at most
        every PRUNE_EVERY_S; a failure is said once and never stops the ledger (the stream keeps them)."""
        nonlocal next_prune, prune_failed
        if ledger.position.partitioned or time.monotonic() < next_prune:
            return
        next_prune = time.monotonic() + retention.PRUNE_EVERY_S
        if watching.first_seen is None:  # (the watch's first look comes first: what a purge is told from)
            return
        try:  # (a stream that begins past where this ledger left it is not pruned: the watch says why)
            ours = max(watching.first_seen, ledger.counters.pruned_to, 1)
            let_go, kept = await retention.prune(nc, nc.jetstream(), not_past=ours)
            ledger.counters.pruned += let_go
            ledger.counters.pruned_to = max(ledger.counters.pruned_to, kept)
        except Exception as err:
            if _error_line(err) != prune_failed:
                prune_failed = _error_line(err)
                log.warning("cannot let go of acked stream messages (%s); they stay in the stream", prune_failed)

    why = None
    while not stop.is_set():
        if not unacked:
            await prune()
        if why is None and time.monotonic() >= next_watch:
            why = await look()
            next_watch = time.monotonic() + WATCH_EVERY_S
        if why:
            if unacked and not await _commit_and_ack(ledger, unacked, stop, since):
                break
            log.error("%s: making it again from what root %s stored (stream seq %d on); nothing is stored twice",
                      why, root, ledger.taken_upto + 1)
            why = None
            try:
                await remake(nc.jetstream())
            except Exception as err:
                log.error("cannot make consumer %r again (%s); trying again", durable, _error_line(err))
                next_watch = time.monotonic() + 0.5
                continue
            await nc.close()
            nc, sub = await subscribe(nats_url, stop, ledger)
            if nc is None:
                return ledger.counters
            watching, delivered = watch(nc.jetstream()), None
            continue
        wait = FETCH_TIMEOUT_S if not unacked else max(0.005, since + COMMIT_EVERY_S - time.monotonic())
        try:
            msgs = await sub.fetch(batch, timeout=wait)  # [] when nothing came in time
        except Exception as err:  # disconnected (nats-py reconnects), or the consumer is gone (looked at now)
            log.debug("fetch failed: %s", err)
            next_watch = 0.0
            await asyncio.sleep(0.2)
            continue
        if not msgs:
            if not unacked:
                ledger.compact_idle()
            elif not await _commit_and_ack(ledger, unacked, stop, since):
                break
            continue
        arrived = time.monotonic()
        first, delivered_before, delivered = consumer_seq(msgs[0]), delivered, consumer_seq(msgs[-1])
        if first is not None and delivered_before is not None and first > delivered_before + 1:
            # Deliveries this subscription never got (a connection lost mid-pull: a cluster node killed,
            # say): JetStream redelivers them only after ack_wait, below messages written meanwhile, where
            # the position would skip them. So nothing past them is written: the consumer is made again
            # from the position (they are above it) and this batch comes again after them, in order.
            why = (f"deliveries {delivered_before + 1}..{first - 1} of consumer {durable!r} never reached this "
                   f"ledger (a connection lost mid-pull)")
            continue
        if first is None or delivered_before is None or first != delivered_before + 1:
            # The consumer's count did not go on from this subscription's last message: a first batch, a
            # pull given up on, or a consumer someone deleted and made anew (delivering from elsewhere:
            # its messages must not move the position past the ones it skipped). Looked at before any
            # is written; what is not written now comes again (redelivered, or from the remade consumer).
            why = await look()
            next_watch = time.monotonic() + WATCH_EVERY_S
            if why:
                continue
        ledger.backlog = pending_after(msgs[-1])
        batch_in = ledger.position.unpack(msgs)
        try:
            decoded = ledger.decode(batch_in)
        except Exception:  # a stored file it had to read is broken, say: the messages one at a time
            log.exception("the ledger failed reading a batch of %d messages; taking them one at a time", len(msgs))
            decoded = None
        failures = 0
        while True:
            try:
                if decoded is None or failures >= IO_RETRIES:  # (then a message's own OSError is its alone)
                    ledger.write_each(batch_in, isolate_io=failures >= IO_RETRIES)
                else:
                    ledger.write_safely(decoded, batch_in)
                ledger.note_taken(max(s for _, _, s in batch_in))  # (a full disk can refuse this file too)
                break
            except OSError as err:  # e.g. the disk is full: keep the batch, ack nothing, try again
                failures += 1
                ledger.counters.write_retries += 1
                log.error("cannot write to %s (%s); not acking %d messages, retrying", root, err, len(msgs))
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except asyncio.TimeoutError:
                    continue
                log.warning("stopping with %d messages unwritten; JetStream will redeliver them", len(msgs) + len(unacked))
                await nc.close()
                return ledger.counters
        if not unacked:
            since = arrived
        unacked += msgs
        # commit once the stream is drained (a batch short of full), else every COMMIT_EVERY_S meanwhile
        if (len(msgs) < batch or time.monotonic() - since >= COMMIT_EVERY_S or stop.is_set()
                or (until_stored is not None and ledger.counters.stored >= until_stored)):
            if not await _commit_and_ack(ledger, unacked, stop, since):
                break
        if until_stored is not None and ledger.counters.stored >= until_stored and not unacked:
            stop.set()
        if time.monotonic() - last_report > 10:
            log.info("ledger: %s", ledger.counters.line())
            last_report = time.monotonic()
    if unacked:
        await _commit_and_ack(ledger, unacked, None, since)
    await nc.flush()  # the acks are out; nothing else is in hand
    await nc.close()
    log.info("ledger stopped: %s", ledger.counters.line())
    return ledger.counters
