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
a row at a time, which it does for everything else (tests/test_verify_stream.py holds the two alike).

A chain may start at a known point (`verify --since`: the head verified before), and may be asked for
the hash it holds at given seqs (`watch`: the recorded heads, the head verified before).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledger.events import make_event_id

PENDING_MAX = 1 << 18  # events of one chain waiting for an earlier seq before its gap is declared
RUN_MIN_ROWS = 16  # a batch smaller than this is walked a row at a time (taking runs whole costs a few calls)

Key = tuple[str, str, int]  # (run_id, producer, attempt)


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

    def start(self, key: Key, seq: int, hash_: str) -> None:
        """Let `key` start after `seq` (whose hash is `hash_`): events from seq + 1 must continue it."""
        self.chains[key] = Chain(next_seq=seq + 1, last_hash=hash_, max_seq=seq, watch={seq: hash_})

    def watch(self, key: Key, seq: int) -> None:
        """Keep the hash stored at `seq` of `key` (see `hash_at`)."""
        self.chains.setdefault(key, Chain()).watch.setdefault(seq, None)

    def take(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Walk stored rows; rows with an empty link cell are left out (rowcheck names them)."""
        cols = [batch.column(c) for c in ("run_id", "producer", "attempt", "seq", "prev_hash", "hash", "event_id")]
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
            self.broken.append((key, first, f"{eids[a].as_py()}: prev_hash does not match the hash of seq {first - 1} (chain broken)"))
        for r in (np.flatnonzero(~links_ok[a:b - 1]) + a + 1).tolist():  # each row links to the one before it
            seq = int(seqs[r])
            self.broken.append((key, seq, f"{eids[r].as_py()}: prev_hash does not match the hash of seq {seq - 1} (chain broken)"))
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
                    self.broken.append((key, seq, f"{eid}: prev_hash does not match the hash of seq {seq - 1} (chain broken)"))
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
                self.broken.append((key, seq, f"{eid}: prev_hash does not match the hash of seq {seq - 1} (chain broken)"))
            chain.next_seq, chain.last_hash = seq + 1, hash_

    def _skip_gap(self, key: Key, chain: Chain) -> None:
        """Declare the seqs before the first waiting event missing, and go on from it."""
        seq = min(chain.pending)
        prev, hash_, eid = chain.pending.pop(seq)
        run, producer, attempt = key
        first, last = (make_event_id(run, producer, attempt, s) for s in (chain.next_seq, seq - 1))
        missing = first if first == last else f"{first} .. {last}"
        self.broken.append((key, chain.next_seq, f"{missing} missing: seq {chain.next_seq}..{seq - 1} of "
                                                 f"{run}:{producer}:{attempt} (gap before {eid})"))
        chain.gaps.append((chain.next_seq, seq - 1))
        chain.next_seq, chain.last_hash = seq + 1, hash_
        self._advance(key, chain)

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
            broken.append(f"{eid}: prev_hash does not match the hash of seq {seq - 1} (chain broken)")
        prev_seq, prev_hash = seq, h
    return copies, broken
