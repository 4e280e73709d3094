"""The signed chain heads of stored chains (runledger.ledger.tlog.chainheads), checked for `runledger verify`
and so for the tlog audit, which verifies the tables it is given with the same function.

Every `chain_head` of a chain is checked (its user key's vouch for the attempt key, its signature, that
it signs the stored event before it), and a chain holding a `run_finished` must have no event after
its last good head. A chain without heads (written before heads, imported, `runledger publish`'s) is
*unsigned*: said, and a problem only when signatures are required.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from runledger.ledger.contract.roles import signs_heads
from runledger.ledger.storage.objects import source
from runledger.ledger.tlog import chainheads

Key = tuple[str, str, int]  # (run_id, producer, attempt)


@dataclass
class Signed:
    signed: int = 0  # chains whose heads all check
    unsigned: list[str] = field(default_factory=list)  # chains without a head
    user_keys: dict[str, int] = field(default_factory=dict)  # user key -> chains it vouched for
    problems: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"signed_chains": self.signed, "unsigned_chains": len(self.unsigned), "user_keys": self.user_keys}

    def text(self) -> str:
        keys = "; ".join(f"{k} ({n} chains)" for k, n in sorted(self.user_keys.items()))
        return (f"chain heads: {self.signed} chains signed" + (f" by user keys {keys}" if keys else "")
                + f", {len(self.unsigned)} unsigned")


def _rows(files: list[Path], columns: list[str]) -> list[dict]:
    rows = []
    for f in files:
        try:
            rows += pq.read_table(source(f), columns=columns).to_pylist()
        except (OSError, ValueError):
            continue  # (the row check names a file that cannot be read)
    return rows


def check_signed(head_files: list[Path], finished_files: list[Path], last_seqs: dict[Key, int],
                 trusted: set[str] | None = None, require: bool = False) -> Signed:
    """Check the heads in `head_files` (the `chain_head` files) of the chains in `last_seqs` (each chain's
    last stored seq), with the `run_finished` files saying which chains finished. `trusted`: the user keys
    (verifier keys) to accept, else any, named. `require`: an unsigned chain is a problem."""
    out = Signed()
    heads: dict[Key, list[chainheads.Head]] = {}
    for r in _rows(head_files, ["run_id", "producer", "attempt", "seq", "prev_hash", "payload"]):
        try:
            payload = json.loads(r["payload"])
        except (TypeError, ValueError):
            continue  # (the row check names a payload that is not its kind's)
        heads.setdefault((r["run_id"], r["producer"], r["attempt"]), []).append(
            chainheads.Head(r["seq"], r["prev_hash"], payload))
    finished: dict[Key, int] = {}
    for r in _rows(finished_files, ["run_id", "producer", "attempt", "seq"]):
        key = (r["run_id"], r["producer"], r["attempt"])
        finished[key] = max(r["seq"], finished.get(key, -1))
    for key in sorted(set(last_seqs) | set(heads)):
        if key not in heads:
            if signs_heads(key[1]):  # (an agent's, a person's or notify's chain carries none)
                out.unsigned.append(":".join(map(str, key)))
            continue
        checked = chainheads.check_chain(*key, heads[key], last_seqs.get(key, -1), finished.get(key), trusted)
        out.problems += checked.problems
        if checked.user_key is not None:
            out.user_keys[checked.user_key] = out.user_keys.get(checked.user_key, 0) + 1
        out.signed += not checked.problems
    if require:
        out.problems += [f"chain {chain}: no signed chain head (written before heads, imported, or sent by "
                         "`runledger publish`), and signed chains are required" for chain in out.unsigned]
    return out


def read_trusted(path: str | Path) -> set[str]:
    """The user keys (verifier keys, one a line; `#` comments) in a file, each checked to parse."""
    from runledger.ledger.tlog import note

    keys = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            keys.add(note.Verifier.parse(line).text())
    return keys
