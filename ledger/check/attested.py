"""The stored attestations of model checkpoints, checked for `runledger verify` and so for the tlog audit,
which verifies the tables it is given with the same function: the `attestation` rows are read here and
handed to the check the caller gives (`runledger.ledger.attest.check_stored`, what `runledger attest verify`
runs, from the layer above: the CLI hands it in); without one, they are counted as unchecked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq

from runledger.ledger.storage.objects import source


@dataclass
class Attested:
    checked: int = 0  # attestations whose folder checks
    absent: list[str] = field(default_factory=list)  # events whose folder is not here (or attested again since)
    unchecked: dict[str, str] = field(default_factory=dict)  # event_id -> why it could not be checked
    problems: list[str] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return bool(self.checked or self.absent or self.unchecked or self.problems)

    def summary(self) -> dict:
        return {"attestations_checked": self.checked, "attestations_not_at_hand": len(self.absent),
                "attestations_unchecked": len(self.unchecked)}

    def text(self) -> str:
        why = sorted(set(self.unchecked.values()))
        return (f"attestations: {self.checked} checked"
                + (f", {len(self.absent)} not at hand (the folder absent, or attested again)" if self.absent else "")
                + (f", {len(self.unchecked)} unchecked ({'; '.join(why)})" if self.unchecked else ""))


def _rows(files: list[Path]) -> list[dict]:
    rows = []
    for f in files:
        try:
            rows += pq.read_table(source(f), columns=["event_id", "payload"]).to_pylist()
        except (OSError, ValueError):
            continue  # (the row check names a file that cannot be read)
    return rows


Check = Callable[[list[tuple[str, dict]], Path | None], Attested]  # (event_id, payload) rows, the root -> findings


def check_attested(files: list[Path], root: Path | None, check: Check | None) -> Attested:
    """Check the `attestation` events in `files` with `check` (`root`: the root whose log the statements' log
    checkpoints are held to; None: an export, which keeps no log)."""
    rows = []
    for r in _rows(files):
        try:
            rows.append((r["event_id"], json.loads(r["payload"])))
        except (TypeError, ValueError):
            continue  # (the row check names a payload that is not its kind's)
    if not rows:
        return Attested()
    if check is None:
        return Attested(unchecked={e: "no attestation check was given (`runledger verify` gives it)" for e, _ in rows})
    return check(rows, root)
