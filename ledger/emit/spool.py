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
import operator
import os
import threading
from pathlib import Path
from typing import NamedTuple

from runledger.ledger.storage import locks
from runledger.ledger.contract.events import HASH_RE, KINDS
from runledger.ledger.storage.files import fsync_dir

log = logging.getLogger(__name__)

SEGMENT_EVENTS = 20_000  # events per spool segment file
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
        except BaseException:
            self._chain_lock.release()
            raise

    def unacknowledged(self) -> int:
        return self.seq - self.acked_upto - len(self.acked)

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

    def sync(self) -> None:
        """fsync the spool without holding up the producer (a disk flush takes milliseconds): on a
        duplicate of the segment's descriptor, so a segment rotated meanwhile is still the one synced."""
        with self.lock:
            if self._seg_fd is None or not self._dirty:
                return
            fd = os.dup(self._seg_fd)
            self._dirty = False
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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
        docstring)."""
        with self.lock:
            self._sync_segment()
            if self._seg_fd is not None:
                os.close(self._seg_fd)
                self._seg_fd = None
        if stored and self.seq > self.stored_upto:
            self.prune()
        self.write_acked()
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
        aside = self.dir / "damaged"
        aside.mkdir(exist_ok=True)
        for line, reason in damaged:
            name = f"{seg.stem}.{hashlib.sha256(line).hexdigest()[:16]}.line"
            (aside / name).write_bytes(line + b"\n")
            (aside / f"{name}.reason").write_text(reason + "\n")
            log.warning("spool %s: a damaged line of %s moved to %s: %s", self.dir, seg.name, aside / name, reason)
        fsync_dir(aside)
        tmp = seg.with_name(f".{seg.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(line + b"\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, seg)
        fsync_dir(self.dir)

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
