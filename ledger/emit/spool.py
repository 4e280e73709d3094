"""The outbox of one chain: sealed events on local disk until JetStream has acknowledged them.

An event that `Emitter.emit` accepted is in the spool file (written before `emit` returns, fsync'd in
batches), so if NATS is slow or down, or the process dies, it is published again later — by this
process's publisher, or by the next one opened on the same spool. Past `max_bytes` of unacknowledged
events `append` raises `SpoolFull`; nothing is ever dropped.

One process per chain: a Spool holds the lock of its folder (released by the OS when the process
dies), and a second Spool on the same chain fails at construction, naming the holder.

Layout: {spool_dir}/{run_id}/{producer}/{attempt}/seg-{first_seq}.jsonl (one canonical envelope per
line), `acked` (every seq below this number is acknowledged) and `lock`; `damaged/` holds the lines
found damaged on reopening (not JSON, not this chain's envelope, torn), each beside its `.reason`.

The intake (what `log` does on the caller's thread): `accept(kind, payload, step)` gives the event
its seq and time and copies `[seq, kind, step, time, payload]` as one JSON line into
in-{first_seq}.jsonl, a file of INTAKE_BYTES mapped into memory (MAP_SHARED: the bytes are the
file's page cache, so they outlive a SIGKILL of the process the moment the copy is done, with no
system call on the caller's thread; the unused rest of the file is zeros). The publisher's thread
seals what was accepted (`seal_accepted`: the hashes and texts `seal` would give at those times)
and appends it to the segments like any event; once a segment holding them is fsync'd, their intake
file goes. Reopening a chain (`_recover_intake`) seals the accepted records past the segments' last
seq first, so a crash between accept and seal loses nothing and seals each event once (the intake's
records below the segments' next seq were sealed before the crash, and are skipped).

Once the ledger's tables hold every event of the chain (its producer asked the ledger at close), the
spool's copy goes (`close(stored=True)`): first `stored` is written (`{seq} {hash}`: every seq below
`seq` is stored, `hash` the last one's), then the segments are removed. The folder stays with those
few bytes, so that the chain goes on from there if its producer opens it again, and its attempt stays
taken. A process killed between the two leaves segments whose lines are below `stored`: reopening
skips them (they are stored: nothing is sent twice) and removes them (nothing is lost: only stored
lines go).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import mmap
import operator
import os
import re
import threading
from pathlib import Path
from typing import NamedTuple

import orjson

from runledger.ledger.storage import locks
from runledger.ledger.contract.events import HASH_RE, KINDS
from runledger.ledger.storage.files import fsync_dir

log = logging.getLogger(__name__)

SEGMENT_EVENTS = 20_000  # events per spool segment file
INTAKE_BYTES = 4 << 20  # an intake file's size (sparse: its unused part costs no disk)
_INTAKE_RE = re.compile(r"in-(\d{12})\.jsonl")
STORED = "stored"  # in a chain's folder: `{seq} {hash}`, every seq below seq in the ledger's tables


class SpoolFull(RuntimeError):
    """More unacknowledged events than the spool may hold; the event was not accepted."""


class Spooled(NamedTuple):  # (a tuple: emit_many makes many, and a tuple is made fastest)
    seq: int
    kind: str
    event_id: str
    data: bytes  # canonical envelope text, no newline
    hash: str


_SEQ, KIND, DATA = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)  # a Spooled's fields, fast


def chain_dir(spool_dir: str | Path, run_id: str, producer: str, attempt: int) -> Path:
    return Path(spool_dir) / run_id / producer / str(attempt)


class Spool:
    """One chain's spool folder: its segments, the acknowledged bound and the queue still to publish.

    `lock` guards the chain's state: the producer appends under it (with its seq), the publisher
    requeues and marks acknowledgements under it."""

    def __init__(self, dir: Path, max_bytes: int, full_hint: str = "") -> None:
        self.dir, self.max_bytes, self.full_hint = dir, max_bytes, full_hint
        dir.mkdir(parents=True, exist_ok=True)
        self._chain_lock = locks.hold(dir / "lock", f"chain {':'.join(dir.parts[-3:])} (spool {dir})",
                                      wait_s=locks.PROBE_S)  # (a local supervisor may be probing it: emitter.leftover_chains)
        try:
            self.lock = threading.Lock()
            self.pending: collections.deque[Spooled] = collections.deque()  # to publish, in seq order
            self.unacked_bytes = 0
            self.acked: set[int] = set()  # acknowledged seqs above acked_upto
            self.acked_upto = self._read_acked()
            self.seq, self.prev_hash = self._read_stored()  # the next seq, and the hash before it
            self.stored_upto = self.seq  # every seq below it is in the ledger's tables, its line gone
            self.acked_upto = max(self.acked_upto, self.stored_upto)
            self._seg_fd: int | None = None
            self._seg_bytes = 0  # the open segment's size
            self._seg_first = 0
            self._dirty = False
            self._recover()
            # the intake: accepted events, not yet sealed (see the module docstring)
            self.sealing = threading.RLock()  # held while accepted events are sealed and appended (then `lock`)
            self.accepted: list[tuple] = []  # (seq, kind, step, time, payload), in seq order, not yet sealed
            self.accepted_bytes = 0
            self.next_seq = self.seq  # the seq the next accepted event gets
            self._in_map: mmap.mmap | None = None
            self._in_pos = 0
            self._in_files: list[tuple[Path, int]] = []  # (intake file, the seq past its last record), oldest first
            self._synced_upto = self.seq  # every sealed seq below it is fsync'd in a segment
            self._dir_dirty = False  # an intake file made since the folder was last fsync'd
            self._recover_intake()
            self.next_seq = self.seq
        except BaseException:
            self._chain_lock.release()
            raise

    def unacknowledged(self) -> int:
        return self.next_seq - self.acked_upto - len(self.acked)

    def append(self, kind: str, ids: list[str], hashes: list[str], texts: list[bytes]) -> None:
        """Append sealed events (the next seqs) to the spool and the queue; under `lock`."""
        data = b"\n".join(texts) + b"\n"
        if self.unacked_bytes + len(data) > self.max_bytes:
            raise SpoolFull(f"spool {self.dir} holds {self.unacked_bytes} bytes of unacknowledged events "
                            f"(limit {self.max_bytes}){self.full_hint}")
        if self._seg_fd is None or self.seq - self._seg_first >= SEGMENT_EVENTS:
            self._open_segment(self.seq)
        self._append(data)
        self._dirty = True
        n = len(ids)
        self.pending.extend(map(Spooled, range(self.seq, self.seq + n), [kind] * n, ids, texts, hashes))
        self.unacked_bytes += len(data) - n
        self.seq += n
        self.prev_hash = hashes[-1]

    def accept(self, kind: str, payload: dict, step: int | None, time: str) -> int:
        """Take an event for sealing later (see the module docstring); return its seq. Under `lock`.
        The record is in the intake file when this returns; `seal_accepted` seals it in seq order."""
        seq = self.next_seq
        try:
            data = orjson.dumps([seq, kind, step, time, payload]) + b"\n"
        except TypeError:  # an int past 64 bits, a subclass of a plain type: the standard library's text
            data = json.dumps([seq, kind, step, time, payload], separators=(",", ":")).encode() + b"\n"
        if self.unacked_bytes + self.accepted_bytes + len(data) > self.max_bytes:
            raise SpoolFull(f"spool {self.dir} holds {self.unacked_bytes + self.accepted_bytes} bytes of "
                            f"unacknowledged events (limit {self.max_bytes}){self.full_hint}")
        if self._in_map is None or self._in_pos + len(data) >= len(self._in_map):
            self._open_intake(seq, len(data))
        pos = self._in_pos
        self._in_map[pos:pos + len(data)] = data
        self._in_pos = pos + len(data)
        self.accepted.append((seq, kind, step, time, payload))
        self.accepted_bytes += len(data)
        self.next_seq = seq + 1
        return seq

    def seal_accepted(self) -> int:
        """Seal what was accepted, in seq order, and append it (the publisher's thread calls this, and
        `close`): the sealing outside `lock`, so `accept` never waits for it. Returns how many it sealed."""
        with self.sealing:
            with self.lock:
                records, self.accepted, self.accepted_bytes = self.accepted, [], 0
            if not records:
                return 0
            kinds, ids, hashes, texts = self._seal(records)
            data = b"\n".join(texts) + b"\n"
            with self.lock:  # (a segment opened under `lock`: `sync` duplicates its descriptor under it)
                if self._seg_fd is None or self.seq - self._seg_first >= SEGMENT_EVENTS:
                    self._open_segment(self.seq)
            self._append(data)  # outside `lock`: `accept` goes on meanwhile (only a sealer writes the segment)
            with self.lock:
                self._queue_sealed(kinds, ids, hashes, texts, len(data))
            return len(records)

    def seal_accepted_locked(self) -> None:
        """`seal_accepted` for a caller that holds `sealing` and `lock` (an event sealed inline goes after
        every event accepted before it)."""
        if self.accepted:
            records, self.accepted, self.accepted_bytes = self.accepted, [], 0
            self._append_sealed(*self._seal(records))

    def _seal(self, records: list[tuple]) -> tuple[list, list, list, list]:
        from runledger.ledger.emit.sealing import seal_accepted

        run_id, producer, attempt = self.dir.parts[-3:]
        ids, hashes, texts, kinds = seal_accepted(run_id, producer, int(attempt), records[0][0],
                                                  [r[1:] for r in records], self.prev_hash)
        return kinds, ids, hashes, texts

    def _append_sealed(self, kinds: list[str], ids: list[str], hashes: list[str], texts: list[bytes]) -> None:
        """`append` for events of several kinds (sealed from the intake): one write, one queue."""
        data = b"\n".join(texts) + b"\n"
        if self._seg_fd is None or self.seq - self._seg_first >= SEGMENT_EVENTS:
            self._open_segment(self.seq)
        self._append(data)
        self._queue_sealed(kinds, ids, hashes, texts, len(data))

    def _queue_sealed(self, kinds: list[str], ids: list[str], hashes: list[str], texts: list[bytes], size: int) -> None:
        """What was just written to the segment: queued to publish, the chain's position moved (under `lock`)."""
        self._dirty = True
        n = len(ids)
        self.pending.extend(map(Spooled, range(self.seq, self.seq + n), kinds, ids, texts, hashes))
        self.unacked_bytes += size - n
        self.seq += n
        self.prev_hash = hashes[-1]

    def _open_intake(self, first: int, need: int) -> None:
        """Start a new intake file at seq `first` (the old one stays until what it holds is synced)."""
        if self._in_map is not None:
            self._in_map.close()
        path = self.dir / f"in-{first:012d}.jsonl"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, max(INTAKE_BYTES, need * 2))
            self._in_map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self._dir_dirty = True  # (the folder's entry fsync'd by `sync`, off the caller's thread)
        self._in_pos = 0
        if self._in_files:
            self._in_files[-1] = (self._in_files[-1][0], first)
        self._in_files.append((path, -1))  # -1: still being written

    def _drop_synced_intake(self) -> None:
        """Remove the intake files whose every record is sealed and fsync'd in a segment (under `lock`)."""
        while self._in_files and 0 <= self._in_files[0][1] <= self._synced_upto:
            self._in_files.pop(0)[0].unlink(missing_ok=True)

    def _recover_intake(self) -> None:
        """Seal the records a crashed process accepted and never sealed (those past the segments' last
        seq), then fsync them and remove the intake files. A record that is not JSON, not the next seq, or
        torn is moved aside into damaged/ with its reason, as a damaged segment line is."""
        files = sorted(p for p in self.dir.glob("in-*.jsonl") if _INTAKE_RE.fullmatch(p.name))
        if not files:
            return
        records, damaged = [], []
        for path in files:
            data = path.read_bytes()
            end = data.find(b"\0")
            lines = (data if end < 0 else data[:end]).split(b"\n")
            torn = lines.pop()
            for line in lines:
                try:
                    seq, kind, step, at, payload = json.loads(line)
                    if type(seq) is not int or not isinstance(payload, dict) or kind not in KINDS:
                        raise ValueError("not an accepted record [seq, kind, step, time, payload]")
                except ValueError as err:  # (UnicodeDecodeError too)
                    damaged.append((path, line, f"not an accepted record: {err}"))
                    continue
                if seq < self.seq:  # sealed before the crash
                    continue
                if seq != self.seq + len(records):
                    damaged.append((path, line, f"seq {seq} is not the next one ({self.seq + len(records)})"))
                    continue
                records.append((kind, step, at, payload))
            if torn:
                damaged.append((path, torn, "a torn last record: the copy was cut off before log returned"))
        for path, line, reason in damaged:
            self._set_aside(path.stem, line, reason)
        if records:
            self._append_sealed(*self._seal([(self.seq + i, *r) for i, r in enumerate(records)]))
            self._sync_segment()
            log.info("spool %s: %d events accepted before a crash were sealed", self.dir, len(records))
        for path in files:
            path.unlink()
        fsync_dir(self.dir)

    def requeue(self, items: list[Spooled]) -> None:
        """Put events back in the queue, keeping seq order (the producer may be appending meanwhile)."""
        with self.lock:
            if self.pending and self.pending[0].seq < items[0].seq:
                merged = sorted([*self.pending, *items], key=lambda s: s.seq)
                self.pending.clear()
                self.pending.extend(merged)
            else:
                self.pending.extendleft(reversed(items))

    def mark_acked(self, items: list[Spooled]) -> None:
        seqs = list(map(_SEQ, items))
        with self.lock:  # append adds to unacked_bytes under the lock; take from it under the lock too
            if min(seqs) >= self.acked_upto and self.acked.isdisjoint(seqs):  # all new (the usual case)
                self.acked.update(seqs)
                self.unacked_bytes -= sum(map(len, map(DATA, items)))
            else:  # some were acked before (a message sent again)
                for i in items:
                    if i.seq >= self.acked_upto and i.seq not in self.acked:
                        self.acked.add(i.seq)
                        self.unacked_bytes -= len(i.data)
        acked = self.acked
        if acked and min(acked) == self.acked_upto and max(acked) - self.acked_upto + 1 == len(acked):
            self.acked_upto += len(acked)  # a gapless run from the bound: move it in one step
            acked.clear()
        else:
            while self.acked_upto in acked:
                acked.discard(self.acked_upto)
                self.acked_upto += 1

    def open_intake(self) -> None:
        """Make the intake file now (an Emitter with a publisher does, at its start), not in the first `accept`."""
        with self.lock:
            if self._in_map is None:
                self._open_intake(self.next_seq, 0)

    def sync(self) -> None:
        """fsync the spool without holding up the producer (a disk flush takes milliseconds): on a
        duplicate of the segment's descriptor, so a segment rotated meanwhile is still the one synced."""
        if self._dir_dirty:
            self._dir_dirty = False
            fsync_dir(self.dir)
        with self.lock:
            if self._seg_fd is None or not self._dirty:
                self._synced_upto = self.seq
                self._drop_synced_intake()
                return
            fd = os.dup(self._seg_fd)
            self._dirty = False
            upto = self.seq
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self.lock:
            self._synced_upto = upto
            self._drop_synced_intake()

    def write_acked(self) -> None:
        tmp = self.dir / ".acked.tmp"
        tmp.write_text(str(self.acked_upto))
        os.replace(tmp, self.dir / "acked")
        segments = self.segments()
        for seg, nxt in zip(segments, segments[1:]):  # done once the next segment starts at or below acked
            if int(nxt.stem[4:]) <= self.acked_upto:
                seg.unlink(missing_ok=True)

    def close(self, stored: bool = False) -> None:
        """Sync and close the open segment, record the acknowledged bound, free the chain. With
        `stored` (the ledger's tables hold every event appended), the segments go (see the module
        docstring). What was accepted and not yet sealed is sealed first."""
        self.seal_accepted()
        with self.lock:
            self._sync_segment()
            if self._seg_fd is not None:
                os.close(self._seg_fd)
                self._seg_fd = None
            if self._in_map is not None:
                self._in_map.close()
                self._in_map = None
        if stored and self.seq > self.stored_upto:
            self.prune()
        self.write_acked()
        for path, _ in self._in_files:  # every record they hold sealed and synced above
            path.unlink(missing_ok=True)
        self._in_files.clear()
        segments = self.segments()
        if self.unacknowledged() and segments:  # left to send: the last segment newer than `acked`, so that
            acked_ns = (self.dir / "acked").stat().st_mtime_ns  # emitter.leftover_chains finds the chain
            os.utime(segments[-1], ns=(acked_ns + 1, acked_ns + 1))
        self._chain_lock.release()

    def prune(self) -> None:
        """Record that every event appended is stored (`stored`, durably), then remove the segments."""
        tmp = self.dir / f".{STORED}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{self.seq} {self.prev_hash}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / STORED)
        fsync_dir(self.dir)
        self.stored_upto = self.seq
        self.acked_upto = max(self.acked_upto, self.seq)
        for seg in self.segments():
            seg.unlink(missing_ok=True)
        fsync_dir(self.dir)

    def segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.jsonl"))

    def _read_stored(self) -> tuple[int, str]:
        """(seq, hash) from `stored`: every seq below `seq` is stored, `hash` the last one's; (0, "")
        when the ledger has not been found to hold the chain."""
        try:
            seq, hash = (self.dir / STORED).read_text().split()
            if int(seq) > 0 and HASH_RE.fullmatch(hash):
                return int(seq), hash
            raise ValueError(f"{seq} {hash}")
        except FileNotFoundError:
            return 0, ""
        except (OSError, ValueError) as err:  # damaged: the segments left say where the chain is
            log.warning("spool %s: its stored file is damaged (%s); going by the segments", self.dir, err)
            return 0, ""

    def _read_acked(self) -> int:
        try:
            return int((self.dir / "acked").read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as err:  # damaged: every event is sent again (the ledger stores each once)
            log.warning("spool %s: its acked file is damaged (%s); sending every event again", self.dir, err)
            return 0

    def _recover(self) -> None:
        """Continue the chain where the spool left it, and queue what was never acknowledged. A line
        that is not this chain's next envelope (damaged on disk, or torn by a crash) is moved aside
        into `damaged/` with its reason: it is never published, and never stops the chain."""
        for seg in self.segments():
            lines = seg.read_bytes().split(b"\n")
            kept: list[bytes] = []
            damaged: list[tuple[bytes, str]] = []
            torn = lines.pop()  # what follows the last newline: a line emit never returned for
            if self.stored_upto:  # a prune cut off: lines of stored events are skipped, and go
                lines = [line for line in lines if not self._stored(line)]
                if not lines and not torn:
                    seg.unlink()
                    continue
            for line in lines:
                env, problem = self._envelope(line)
                if problem:
                    damaged.append((line, problem))
                    continue
                kept.append(line)
                self.seq, self.prev_hash = env["seq"] + 1, env["hash"]
                if env["seq"] >= self.acked_upto:
                    self.pending.append(Spooled(env["seq"], env["kind"], env["event_id"], line, env["hash"]))
                    self.unacked_bytes += len(line)
            if torn:
                damaged.append((torn, "a torn last line: the write was cut off before emit returned"))
            if damaged:
                self._quarantine(seg, kept, damaged)
        if self.pending:
            log.info("spool %s: %d unacknowledged events will be published again", self.dir, len(self.pending))
        self.acked_upto = min(self.acked_upto, self.seq)

    def _stored(self, line: bytes) -> bool:
        """Whether `line` is an event of this chain below `stored_upto` (in the ledger's tables)."""
        env, problem = self._envelope(line, ordered=False)
        return problem is None and env["seq"] < self.stored_upto

    def _envelope(self, line: bytes, ordered: bool = True) -> tuple[dict, str | None]:
        """The line's envelope, or the reason it is not the next envelope of this chain."""
        try:
            env = json.loads(line)
        except ValueError as err:  # (UnicodeDecodeError too)
            return {}, f"not JSON text: {err}"
        if not isinstance(env, dict):
            return {}, f"not an envelope: a JSON {type(env).__name__}"
        run_id, producer, attempt = self.dir.parts[-3:]
        if (env.get("run_id"), env.get("producer"), str(env.get("attempt"))) != (run_id, producer, attempt):
            return {}, f"not an envelope of chain {run_id}:{producer}:{attempt}"
        if type(env.get("seq")) is not int or not all(type(env.get(k)) is str for k in ("kind", "event_id", "hash")):
            return {}, "not an envelope: seq, kind, event_id or hash is missing or of the wrong type"
        if env["kind"] not in KINDS or not HASH_RE.fullmatch(env["hash"]):
            return {}, f"not an envelope: kind {env['kind'][:64]!r} or its hash is not valid"
        if ordered and env["seq"] < self.seq:
            return {}, f"seq {env['seq']} is not after the previous line's ({self.seq - 1})"
        return env, None

    def _quarantine(self, seg: Path, kept: list[bytes], damaged: list[tuple[bytes, str]]) -> None:
        """Move damaged lines of `seg` aside into damaged/ (each with a .reason file), then rewrite
        the segment with the lines kept."""
        for line, reason in damaged:
            self._set_aside(seg.stem, line, reason)
        tmp = seg.with_name(f".{seg.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(line + b"\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, seg)
        fsync_dir(self.dir)

    def _set_aside(self, stem: str, line: bytes, reason: str) -> None:
        """Keep a damaged line in damaged/, beside a .reason file."""
        aside = self.dir / "damaged"
        aside.mkdir(exist_ok=True)
        name = f"{stem}.{hashlib.sha256(line).hexdigest()[:16]}.line"
        (aside / name).write_bytes(line + b"\n")
        (aside / f"{name}.reason").write_text(reason + "\n")
        fsync_dir(aside)
        log.warning("spool %s: a damaged line of %s moved to %s: %s", self.dir, stem, aside / name, reason)

    def _open_segment(self, first: int) -> None:
        self._sync_segment()
        if self._seg_fd is not None:
            os.close(self._seg_fd)
        self._seg_first = first
        self._seg_fd = os.open(self.dir / f"seg-{first:012d}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._seg_bytes = os.fstat(self._seg_fd).st_size  # (no lseek per write: it waits out a concurrent fsync)
        fsync_dir(self.dir)

    def _append(self, data: bytes) -> None:
        """Append whole lines to the segment, or nothing (a failed write, e.g. a full disk, is cut off)."""
        try:
            written = os.write(self._seg_fd, data)
            while written < len(data):
                written += os.write(self._seg_fd, data[written:])
        except BaseException:
            os.ftruncate(self._seg_fd, self._seg_bytes)
            raise
        self._seg_bytes += len(data)

    def _sync_segment(self) -> None:
        if self._seg_fd is not None and self._dirty:
            os.fsync(self._seg_fd)
            self._dirty = False
