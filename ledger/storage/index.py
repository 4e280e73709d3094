"""Which events a root stores already, by chain and seq: what makes ingest idempotent."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runledger.ledger.storage.reads import read_events


@dataclass
class SeqIndex:
    """Which (run_id, producer, attempt, seq) are stored, compactly: seqs are gapless per chain,
    so each chain is `upto` (all seqs below it stored) plus the few stored above it."""

    chains: dict[tuple[str, str, int], list] = field(default_factory=dict)

    def __contains__(self, key: tuple[str, str, int, int]) -> bool:
        c = self.chains.get(key[:3])
        return c is not None and (key[3] < c[0] or key[3] in c[1])

    def any_stored(self, chain: tuple[str, str, int], first: int, count: int) -> bool:
        """Whether any of the seqs first .. first+count-1 of `chain` is stored."""
        c = self.chains.get(chain)
        return c is not None and (first < c[0] or any(first <= s < first + count for s in c[1]))

    def add_range(self, chain: tuple[str, str, int], first: int, count: int) -> None:
        """Add seqs first .. first+count-1 of `chain`."""
        c = self.chains.get(chain)
        if c is None and first == 0:
            self.chains[chain] = [count, set()]
        elif c is not None and c[0] == first and not c[1]:
            c[0] = first + count
        else:
            for seq in range(first, first + count):
                self.add((*chain, seq))

    def add(self, key: tuple[str, str, int, int]) -> None:
        c = self.chains.setdefault(key[:3], [0, set()])
        seq = key[3]
        if seq < c[0]:
            return
        c[1].add(seq)
        while c[0] in c[1]:
            c[1].discard(c[0])
            c[0] += 1

    def add_all(self, keys: list[tuple[str, str, int, int]]) -> None:
        """Add many; a run of consecutive seqs that continues a chain costs one step, not one per seq."""
        i, n = 0, len(keys)
        while i < n:
            chain, first = keys[i][:3], keys[i][3]
            j = i + 1
            while j < n and keys[j][3] == first + (j - i) and keys[j][:3] == chain:
                j += 1
            self.add_range(chain, first, j - i)
            i = j

    def __len__(self) -> int:
        return sum(c[0] + len(c[1]) for c in self.chains.values())

    @classmethod
    def load(cls, root: Path, run_id: str | None = None) -> "SeqIndex":
        """What `root` stores (of run `run_id` only, if given)."""
        idx = SeqIndex()
        t = read_events(root, run_id=run_id, columns=["run_id", "producer", "attempt", "seq"])
        if t.num_rows == 0:
            return idx
        # count_distinct, not count: a chain with a gap and a duplicate ([0, 1, 3, 3]) must not pass as gapless
        stats = t.group_by(["run_id", "producer", "attempt"]).aggregate(
            [("seq", "min"), ("seq", "max"), ("seq", "count_distinct")])
        irregular = set()
        for r in stats.to_pylist():
            key = (r["run_id"], r["producer"], r["attempt"])
            if r["seq_min"] == 0 and r["seq_count_distinct"] == r["seq_max"] + 1:
                idx.chains[key] = [r["seq_max"] + 1, set()]
            else:
                irregular.add(key)
        if irregular:  # gaps or duplicates on disk: index those chains seq by seq
            for r in t.to_pylist():
                key = (r["run_id"], r["producer"], r["attempt"])
                if key in irregular:
                    idx.add((*key, r["seq"]))
        return idx


class LazyIndex(SeqIndex):
    """A SeqIndex loaded a run at a time, when a message of the run first needs it: a restarted ledger
    reads its place from the tables' commit (runledger.ledger.storage.streampos) and skips what lies at
    or below it, so only the runs of messages above it are ever looked up, and a restart costs nothing
    per stored event. `on_load(run_id, index)` is called once per run loaded (the heads' check)."""

    def __init__(self, root: Path, on_load=None) -> None:
        super().__init__()
        self.root, self.on_load = Path(root), on_load
        self.loaded: set[str] = set()

    def load_run(self, run_id: str) -> None:
        if run_id in self.loaded:
            return
        self.loaded.add(run_id)
        stored = SeqIndex.load(self.root, run_id)
        for chain, (upto, above) in stored.chains.items():
            self.add_range(chain, 0, upto)
            for seq in above:
                self.add((*chain, seq))
        if self.on_load is not None:
            self.on_load(run_id, self)

    def __contains__(self, key) -> bool:
        self.load_run(key[0])
        return super().__contains__(key)

    def any_stored(self, chain, first: int, count: int) -> bool:
        self.load_run(chain[0])
        return super().any_stored(chain, first, count)

    def add_all(self, keys) -> None:
        for run_id in {k[0] for k in keys}:
            self.load_run(run_id)
        super().add_all(keys)
