"""Hash chains walked in stream order, in bounded memory: gaps, broken links, events stored twice.

`ChainWalk.take(batch)` takes stored rows (the `rowcheck.LINK` columns) in about stream order, as
`streams.in_stream_order` reads them; each chain (run_id, producer, attempt) keeps only its frontier
(the next seq it expects, the hash it must link to) and the few events that came before their turn.
A ledger stores a chain's events in stream order, and a chain's events of different kinds lie in
different files, read side by side, so that waiting set stays within a batch per file.

A chain that waits too long (PENDING_MAX events: a seq is missing, so nothing after it can link) has
the gap declared, as the sorted check would have found it. An event that comes later than that
(stored far out of stream order) is no gap after all: its chain is marked for `recheck`, the exact
sorted check of that chain alone (memory of that chain), whose findings replace the walk's.

Rows of one chain with consecutive seqs, next in turn, are taken as a run (`_take_run`): their links
compared by Arrow at once, and the chain moved to the run's end; what `_take_rows` would do with them
a row at a time, which it does for everything else (tests/{unit,integration}/test_verify_stream.py holds the two alike).

A chain may start at a known point (`verify --since`: the head verified before), and may be asked for
the hash it holds at given seqs (`watch`: the recorded heads, the head verified before).

Summaries, so that verify reads each byte once: the process that checks a part of a file also
summarises its link columns (`Summariser`): the part's rows as segments (one chain's consecutive seqs,
each row linked to the one before it, which it checks there), and the hashes at the watched seqs.
`ChainWalk.take_sorted` then links a chain from all its segments, sorted, as the walk would have from
the rows. A part whose rows make too many segments (chains interleaved row by row) hands back none,
and its run is walked from its rows instead, so a part's summary holds at most SEGMENTS_FLOOR
segments and one more per SEGMENT_ROWS rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runledger.ledger.contract.events import make_event_id

PENDING_MAX = 1 << 18  # events of one chain waiting for an earlier seq before its gap is declared
RUN_MIN_ROWS = 16  # a batch smaller than this is walked a row at a time (taking runs whole costs a few calls)

Key = tuple[str, str, int]  # (run_id, producer, attempt)


def broken_link(eid: str, seq: int) -> str:
    """The problem of event `eid` (at `seq`) whose prev_hash is not the hash of seq - 1."""
    return f"{eid}: prev_hash does not match the hash of seq {seq - 1} (chain broken)"

LINK = ("run_id", "producer", "attempt", "seq", "prev_hash", "hash", "event_id")  # the columns a walk reads


@dataclass
class Chain:
    next_seq: int = 0  # every seq below it is taken (or declared missing)
    last_hash: str = ""  # the hash of seq next_seq - 1, which the next event must link to
    max_seq: int = -1
    pending: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # seq -> (prev_hash, hash, event_id)
    watch: dict[int, str | None] = field(default_factory=dict)  # seq -> the first hash stored at it
    gaps: list[tuple[int, int]] = field(default_factory=list)  # seq ranges declared missing
    recheck: bool = False


@dataclass
class ChainWalk:
    chains: dict[Key, Chain] = field(default_factory=dict)
    copies: dict[tuple[Key, int], int] = field(default_factory=dict)  # (chain, seq) -> times stored, if > 1
    broken: list[tuple[Key, int, str]] = field(default_factory=list)  # (chain, seq, problem)
    pending_max: int = PENDING_MAX
    _seen_at: dict[tuple[Key, int], int] = field(default_factory=dict)  # watched (chain, seq) -> stream_seq of the hash kept

    def start(self, key: Key, seq: int, hash_: str) -> None:
        """Let `key` start after `seq` (whose hash is `hash_`): events from seq + 1 must continue it."""
        self.chains[key] = Chain(next_seq=seq + 1, last_hash=hash_, max_seq=seq, watch={seq: hash_})

    def watch(self, key: Key, seq: int) -> None:
        """Keep the hash stored at `seq` of `key` (see `hash_at`)."""
        self.chains.setdefault(key, Chain()).watch.setdefault(seq, None)

    def take(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Walk stored rows; rows with an empty link cell, or of a file without a link column, are left
        out (rowcheck names them)."""
        if not set(LINK) <= set(batch.schema.names):
            return
        cols = [batch.column(c) for c in LINK]
        if any(c.null_count for c in cols):
            mask = cols[0].is_valid()
            for c in cols[1:]:
                mask = pc.and_(mask, c.is_valid())
            cols = [c.filter(mask) for c in cols]
        if isinstance(batch, pa.Table):
            cols = [c.combine_chunks() for c in cols]
        runs = _runs(cols) if len(cols[0]) >= RUN_MIN_ROWS else None
        if runs is None:
            self._take_rows(zip(*(c.to_pylist() for c in cols)))
            return
        bounds, seqs, links_ok = runs
        rows = None  # the rows as Python values, made if a run has to be walked a row at a time
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b - a > 1 and self._take_run(cols, a, b, seqs, links_ok):
                continue
            if rows is None:
                rows = [c.to_pylist() for c in cols]
            self._take_rows(zip(*(r[a:b] for r in rows)))

    def _take_run(self, cols: list[pa.Array], a: int, b: int, seqs: np.ndarray, links_ok: np.ndarray) -> bool:
        """Take rows a..b-1 (one chain, consecutive seqs) at once, if they are next in turn and none of
        their seqs waits already; what `_take_rows` would do with them one by one. False if not."""
        key = (cols[0][a].as_py(), cols[1][a].as_py(), cols[2][a].as_py())
        chain = self.chains.get(key)
        if chain is None:
            chain = self.chains[key] = Chain()
        first, last = int(seqs[a]), int(seqs[b - 1])
        if chain.next_seq != first or (chain.pending and not chain.pending.keys().isdisjoint(range(first, last + 1))):
            return False
        prev, hashes, eids = cols[4], cols[5], cols[6]
        if prev[a].as_py() != chain.last_hash:
            self.broken.append((key, first, broken_link(eids[a].as_py(), first)))
        for r in (np.flatnonzero(~links_ok[a:b - 1]) + a + 1).tolist():  # each row links to the one before it
            seq = int(seqs[r])
            self.broken.append((key, seq, broken_link(eids[r].as_py(), seq)))
        for seq, h in (list(chain.watch.items()) if chain.watch else ()):
            if h is None and first <= seq <= last:
                chain.watch[seq] = hashes[a + seq - first].as_py()
        chain.next_seq, chain.last_hash = last + 1, hashes[b - 1].as_py()
        chain.max_seq = max(chain.max_seq, last)
        if chain.pending and last + 1 in chain.pending:
            self._advance(key, chain)
        return True

    def _take_rows(self, rows) -> None:
        """Walk rows (run_id, producer, attempt, seq, prev_hash, hash, event_id) one at a time."""
        chains = self.chains
        key = chain = None
        for run, producer, attempt, seq, prev, hash_, eid in rows:
            if key is None or key[0] != run or key[1] != producer or key[2] != attempt:
                key = (run, producer, attempt)
                chain = chains.get(key)
                if chain is None:
                    chain = chains[key] = Chain()
            if chain.watch and seq in chain.watch and chain.watch[seq] is None:
                chain.watch[seq] = hash_
            if seq == chain.next_seq:  # the usual case: the next link
                if prev != chain.last_hash:
                    self.broken.append((key, seq, broken_link(eid, seq)))
                chain.next_seq, chain.last_hash = seq + 1, hash_
                if seq > chain.max_seq:
                    chain.max_seq = seq
                if chain.pending and seq + 1 in chain.pending:
                    self._advance(key, chain)
            elif seq > chain.next_seq and seq not in chain.pending and len(chain.pending) < self.pending_max:
                # the other usual case, `_out_of_turn` inlined: an event ahead of its turn waits (the seq
                # next in turn is not waiting, or it would have been taken: nothing to advance)
                chain.pending[seq] = (prev, hash_, eid)
                if seq > chain.max_seq:
                    chain.max_seq = seq
            else:
                self._out_of_turn(key, chain, seq, prev, hash_, eid)

    def _out_of_turn(self, key: Key, chain: Chain, seq: int, prev: str, hash_: str, eid: str) -> None:
        chain.max_seq = max(chain.max_seq, seq)
        if seq < chain.next_seq or seq in chain.pending:
            if any(a <= seq <= b for a, b in chain.gaps):
                chain.recheck = True  # declared missing, yet here: stored far out of order
            else:
                self.copies[(key, seq)] = self.copies.get((key, seq), 1) + 1
            return
        chain.pending[seq] = (prev, hash_, eid)
        self._advance(key, chain)
        while len(chain.pending) > self.pending_max:
            self._skip_gap(key, chain)

    def _advance(self, key: Key, chain: Chain) -> None:
        """Take the waiting events that are now next in turn."""
        pending = chain.pending
        while chain.next_seq in pending:
            seq = chain.next_seq
            prev, hash_, eid = pending.pop(seq)
            if prev != chain.last_hash:
                self.broken.append((key, seq, broken_link(eid, seq)))
            chain.next_seq, chain.last_hash = seq + 1, hash_

    def _skip_gap(self, key: Key, chain: Chain) -> None:
        """Declare the seqs before the first waiting event missing, and go on from it."""
        seq = min(chain.pending)
        prev, hash_, eid = chain.pending.pop(seq)
        self._declare_gap(key, chain, seq, eid)
        chain.next_seq, chain.last_hash = seq + 1, hash_
        self._advance(key, chain)

    def _declare_gap(self, key: Key, chain: Chain, seq: int, eid: str) -> None:
        """The seqs from the chain's next one to `seq` - 1 are missing (`eid`: the event at `seq`)."""
        run, producer, attempt = key
        first, last = (make_event_id(run, producer, attempt, s) for s in (chain.next_seq, seq - 1))
        missing = first if first == last else f"{first} .. {last}"
        self.broken.append((key, chain.next_seq, f"{missing} missing: seq {chain.next_seq}..{seq - 1} of "
                                                 f"{run}:{producer}:{attempt} (gap before {eid})"))
        chain.gaps.append((chain.next_seq, seq - 1))

    def take_sorted(self, key: Key, segments: list[Segment]) -> None:
        """Take every stored event of chain `key` at once, summarised as segments (a `Summary`'s, of all
        the parts that hold the chain), sorted by (first, stream_seq): gaps and the links between
        segments, as the walk finds them from the rows (the links inside a segment were checked by the
        summariser). An event stored again inside what is taken is counted as a copy; a segment that
        both repeats events and goes on past them, or a chain the walk holds events of out of turn,
        is left to the exact check (`recheck`)."""
        chain = self.chains.get(key)
        if chain is None:
            chain = self.chains[key] = Chain()
        if chain.pending:
            chain.recheck = True
        for seg in segments:
            if seg.first < chain.next_seq:
                if seg.last >= chain.next_seq:  # which copy the rows after it link to is not known here
                    chain.recheck = True
                    chain.next_seq, chain.last_hash = seg.last + 1, seg.last_hash
                else:
                    for seq in range(seg.first, seg.last + 1):
                        self.copies[(key, seq)] = self.copies.get((key, seq), 1) + 1
            else:
                if seg.first > chain.next_seq:
                    self._declare_gap(key, chain, seg.first, seg.first_eid)
                elif seg.first_prev != chain.last_hash:
                    self.broken.append((key, seg.first, broken_link(seg.first_eid, seg.first)))
                self.broken += [(key, seq, problem) for seq, problem in seg.broken]
                chain.next_seq, chain.last_hash = seg.last + 1, seg.last_hash
            chain.max_seq = max(chain.max_seq, seg.last)

    def take_seen(self, summary: Summary) -> None:
        """The hashes a part's summary saw at the watched seqs (of several copies, the one stored first:
        the least stream_seq)."""
        for (key, seq), (stream_seq, hash_) in summary.seen.items():
            chain = self.chains.get(key)
            if chain is None or seq not in chain.watch:
                continue
            kept = self._seen_at.get((key, seq))
            if (kept is None and chain.watch[seq] is None) or (kept is not None and stream_seq < kept):
                chain.watch[seq], self._seen_at[(key, seq)] = hash_, stream_seq

    def finish(self) -> None:
        """No more rows: what still waits lies after a gap."""
        for key, chain in self.chains.items():
            while chain.pending:
                self._skip_gap(key, chain)

    def hash_at(self, key: Key, seq: int) -> str | None:
        chain = self.chains.get(key)
        return None if chain is None else chain.watch.get(seq)

    def problems(self) -> list[str]:
        """Events stored twice, then gaps and broken links, by chain and seq (of the chains not rechecked)."""
        recheck = {key for key, chain in self.chains.items() if chain.recheck}
        copies = [f"{make_event_id(*key, seq)}: stored {n} times" for (key, seq), n in sorted(self.copies.items())
                  if key not in recheck]
        broken = [p for key, _, p in sorted(self.broken, key=lambda b: (b[0], b[1])) if key not in recheck]
        return copies + broken


class Segment(NamedTuple):
    """Rows of one chain with consecutive seqs, in file order; each linked to the row before it, or named
    in `broken`."""

    producer: str
    attempt: int
    first: int
    last: int
    first_prev: str  # the prev_hash of seq `first`
    last_hash: str  # the hash of seq `last`
    first_eid: str
    stream_seq: int  # of seq `first`: which of two copies was stored first
    broken: list[tuple[int, str]]  # (seq, problem) of each row inside it that does not link to the row before it


@dataclass
class Summary:
    """The link columns of a part of one run's events file, as `ChainWalk.take_sorted` and `take_seen`
    take them. `segments` is None if they were too many to be worth handing on (see `Summariser`)."""

    run_id: str
    segments: list[Segment] | None = field(default_factory=list)
    seen: dict[tuple[Key, int], tuple[int, str]] = field(default_factory=dict)  # watched (chain, seq) -> (stream_seq, hash)


SEGMENTS_FLOOR = 65_536  # segments a part may hand on whatever its size (an eval every 1,000 steps: 10k in 10M events)
SEGMENT_ROWS = 32  # and one more for every this many rows (memory: ~0.5 KB a segment)


class Summariser:
    """Summarise a part's rows (batches of at least `rowcheck.LINK` and stream_seq, in file order) for
    run `run_id`: rows of another run, or with an empty link cell, are left out (the row checks name
    them). `watch`: (producer, attempt) -> the seqs whose hashes are wanted."""

    def __init__(self, run_id: str, watch: dict[tuple[str, int], set[int]] | None = None):
        self.summary = Summary(run_id)
        self.watch = watch or {}
        self.rows = 0

    def take(self, batch: pa.RecordBatch) -> None:
        segments = self.summary.segments
        if segments is None:
            return
        self.rows += batch.num_rows
        names = batch.schema.names
        if not set(LINK) <= set(names):
            self.summary.segments = None  # (a column dropped: the row checks name every row)
            return
        cols = [batch.column(c) for c in LINK]
        stream_seq = batch.column("stream_seq") if "stream_seq" in names else None
        if stream_seq is None or not pa.types.is_integer(stream_seq.type):
            stream_seq = pa.nulls(batch.num_rows, pa.int64())
        mask = pc.fill_null(pc.equal(cols[0], self.summary.run_id), False)
        for c in cols[1:]:
            if c.null_count:
                mask = pc.and_(mask, c.is_valid())
        if not pc.all(mask).as_py():
            cols, stream_seq = [c.filter(mask) for c in cols], stream_seq.filter(mask)
        if len(cols[0]) == 0:
            return
        runs = _runs(cols)
        if runs is None:
            self.summary.segments = None  # (link columns of unusual types: the walk takes such rows one by one)
            return
        bounds, seqs, links_ok = runs
        _, producer, attempt, _, prev, hashes, eids = cols
        starts, ends = np.array(bounds[:-1]), np.array(bounds[1:]) - 1
        inside = np.ones(len(links_ok), bool)  # row r + 1 is in the segment of row r
        inside[starts[1:] - 1] = False
        broken: dict[int, list[tuple[int, str]]] = {}  # segment -> its rows that do not link to the row before
        for r in (np.flatnonzero(~links_ok & inside) + 1).tolist():
            broken.setdefault(int(np.searchsorted(starts, r, side="right")) - 1, []).append(
                (int(seqs[r]), broken_link(eids[r].as_py(), int(seqs[r]))))
        firsts = pa.array(starts)
        new = zip(producer.take(firsts).to_pylist(), attempt.take(firsts).to_pylist(), seqs[starts].tolist(),
                  seqs[ends].tolist(), prev.take(firsts).to_pylist(), hashes.take(pa.array(ends)).to_pylist(),
                  eids.take(firsts).to_pylist(), pc.fill_null(stream_seq.take(firsts), -1).to_pylist())
        for i, seg in enumerate(new):
            seg = Segment(*seg, broken.get(i, []))
            tail = segments[-1] if segments else None
            if tail is not None and (tail.producer, tail.attempt) == (seg.producer, seg.attempt) and seg.first == tail.last + 1:
                if seg.first_prev != tail.last_hash:
                    tail.broken.append((seg.first, broken_link(seg.first_eid, seg.first)))
                tail.broken.extend(seg.broken)
                segments[-1] = tail._replace(last=seg.last, last_hash=seg.last_hash)
            else:
                segments.append(seg)
        if self.watch:
            self._see(producer, attempt, seqs, hashes, stream_seq)
        if len(segments) > SEGMENTS_FLOOR + self.rows // SEGMENT_ROWS:
            self.summary.segments = None  # chains interleaved row by row: the walk reads this part's rows itself

    def _see(self, producer: pa.Array, attempt: pa.Array, seqs: np.ndarray, hashes: pa.Array, stream_seq: pa.Array) -> None:
        """Keep the hashes at the watched seqs (the least stream_seq's, if stored more than once)."""
        wanted = np.isin(seqs, np.fromiter({s for w in self.watch.values() for s in w}, np.int64))
        for r in np.flatnonzero(wanted).tolist():
            chain = (producer[r].as_py(), attempt[r].as_py())
            seq = int(seqs[r])
            if seq not in self.watch.get(chain, ()):
                continue
            at = (self.summary.run_id, *chain), seq
            here = (stream_seq[r].as_py() if stream_seq[r].is_valid else -1, hashes[r].as_py())
            if at not in self.summary.seen or here[0] < self.summary.seen[at][0]:
                self.summary.seen[at] = here


def _runs(cols: list[pa.Array]) -> tuple[list[int], np.ndarray, np.ndarray] | None:
    """The runs of a batch's rows that are one chain's consecutive seqs, in row order: (their bounds,
    the seqs, whether each row but the first links to the row before it), or None if the link columns
    are not of the usual types."""
    run_id, producer, attempt, seq, prev, hashes = cols[:6]
    n = len(seq)
    if not (pa.types.is_integer(seq.type) and pa.types.is_integer(attempt.type)
            and all(pa.types.is_string(c.type) for c in (run_id, producer, prev, hashes))):
        return None
    seqs = seq.to_numpy()
    breaks = np.diff(seqs) != 1
    for c in (run_id, producer, attempt):
        breaks |= pc.not_equal(c.slice(1), c.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    links_ok = pc.equal(prev.slice(1), hashes.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return [0, *(np.flatnonzero(breaks) + 1).tolist(), n], seqs, links_ok


def sorted_check(key: Key, links: list[tuple[int, str, str, str]]) -> tuple[list[str], list[str]]:
    """The exact check of one chain from all its (seq, prev_hash, hash, event_id): (events stored more
    than once, gaps and broken links), as the walk reports them."""
    run, producer, attempt = key
    links = sorted(links, key=lambda r: r[0])
    times = Counter(seq for seq, *_ in links)
    copies = [f"{make_event_id(run, producer, attempt, seq)}: stored {n} times" for seq, n in sorted(times.items()) if n > 1]
    broken = []
    prev_seq, prev_hash = -1, ""
    for seq, ph, h, eid in links:
        if seq == prev_seq:
            continue  # a second copy, counted above
        if seq != prev_seq + 1:
            first, last = (make_event_id(run, producer, attempt, s) for s in (prev_seq + 1, seq - 1))
            missing = first if first == last else f"{first} .. {last}"
            broken.append(f"{missing} missing: seq {prev_seq + 1}..{seq - 1} of {run}:{producer}:{attempt} "
                          f"(gap before {eid})")
        elif ph != prev_hash:
            broken.append(broken_link(eid, seq))
        prev_seq, prev_hash = seq, h
    return copies, broken
