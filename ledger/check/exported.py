"""Verify an export (runledger.ledger.storage.export) from its files alone: what `runledger verify --root DIR` does
for a folder holding an export's manifest.

Per row, the checks of a stored row (`rowcheck.check_part`: the hash recomputed from the envelope columns
and the canonical payload text, the payload valid for its kind, the typed columns true to it, the event_id
rule, the file's partition, the ledger's digest of its own columns); per chain, the walk of a stored root
(`chainwalk.ChainWalk`: seqs gapless from 0, each prev_hash the hash before it, no event twice), each chain
ending at the head the manifest names; per file, the bytes the manifest lists (a file missing, added or
changed is a problem); the chains' signed heads and the checkpoints' attestations, as for a root
(`runledger.ledger.check.signed`, `runledger.ledger.check.attested`: no log checkpoint, an export keeps no log). Nothing of the
source root is read. A CSV export is not checked here (its typed
columns are not kept); its hashes are recomputed the same way from its envelope columns and payload text.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runledger.ledger.check import attested, chainwalk, rowcheck, signed
from runledger.ledger.check.verify import Report
from runledger.ledger.contract.events import KINDS
from runledger.ledger.storage import export
from runledger.ledger.storage.objects import source
from runledger.ledger.tlog import chainheads


def verify_export(folder: str | Path, require_signed: bool = False, trusted: set[str] | None = None,
                  attestations: attested.Check | None = None) -> Report:
    """Check the export in `folder` (see the module docstring); ValueError (one line) if it holds none, or a CSV one."""
    folder = Path(folder)
    manifest = export.read_manifest(folder)
    if manifest.get("files_format") != "parquet":
        raise ValueError(f"{folder} is a {manifest.get('files_format')} export: verify checks a Parquet export "
                         "(`runledger export --format parquet`)")
    report = Report()
    listed = {f["path"]: f for f in manifest.get("files", [])}
    on_disk = {str(p.relative_to(folder)): p for p in sorted(folder.glob("events/kind=*/run_id=*/*.parquet"))}
    for rel in sorted(set(listed) - set(on_disk)):
        report.problems.append(f"{rel}: listed in {export.MANIFEST}, but not in the export (deleted?)")
    for rel in sorted(set(on_disk) - set(listed)):
        report.problems.append(f"{rel}: in the export, but not in {export.MANIFEST} (planted?)")
    walk = chainwalk.ChainWalk()
    by_run: dict[str, list[Path]] = {}
    for rel, path in on_disk.items():
        kind, run_id = path.parent.parent.name.removeprefix("kind="), path.parent.name.removeprefix("run_id=")
        if kind not in KINDS:
            report.problems.append(f"{rel}: unknown kind {kind!r}")
            continue
        if rel in listed and rowcheck.file_sha256(path) != listed[rel]["sha256"]:
            report.problems.append(f"{rel}: its bytes are not those {export.MANIFEST} lists (changed after the export?)")
        part = rowcheck.check_part(str(path), kind, run_id, list(range(_row_groups(path))), whole_file=True)
        report.problems += part.problems
        report.events += part.rows
        by_run.setdefault(run_id, []).append(path)
    for run_id, files in sorted(by_run.items()):
        links = [_links(f) for f in files]
        table = pa.concat_tables([t for t in links if t is not None]) if any(t is not None for t in links) else None
        if table is not None and table.num_rows:
            walk.take(table.sort_by([("producer", "ascending"), ("attempt", "ascending"), ("seq", "ascending")]))
    walk.finish()
    report.problems += walk.problems()
    of_kind = {k: [p for p in on_disk.values() if p.parent.parent.name == f"kind={k}"] for k in (chainheads.KIND, "run_finished")}
    report.signed = signed.check_signed(of_kind[chainheads.KIND], of_kind["run_finished"],
                                        {key: c.next_seq - 1 for key, c in walk.chains.items() if c.max_seq >= 0},
                                        trusted, require_signed)
    report.problems += report.signed.problems
    report.attested = attested.check_attested([p for p in on_disk.values() if p.parent.parent.name == "kind=attestation"],
                                              None, attestations)
    report.problems += report.attested.problems
    for run_id, chains in sorted((manifest.get("heads") or {}).items()):
        for c in chains:
            chain = walk.chains.get((run_id, c["producer"], c["attempt"]))
            end = (chain.max_seq, walk.hash_at((run_id, c["producer"], c["attempt"]), chain.max_seq)) if chain else (-1, None)
            if chain is None or chain.max_seq != c["seq"] or chain.next_seq != c["seq"] + 1 or chain.last_hash != c["hash"]:
                report.problems.append(f"{run_id}:{c['producer']}:{c['attempt']}: the chain ends at seq {end[0]}, not at the "
                                       f"head the export recorded (seq {c['seq']}, hash {c['hash'][:16]}…): cut short?")
    report.files = len(on_disk)
    report.chains = sum(1 for c in walk.chains.values() if c.max_seq >= 0)
    report.checked, report.checked_files = report.events, len(on_disk)
    return report


def _row_groups(path: Path) -> int:
    try:
        return pq.ParquetFile(source(path)).metadata.num_row_groups
    except (OSError, ValueError, pa.ArrowException):
        return 1  # (check_part then says it cannot be read)


def _links(path: Path) -> pa.Table | None:
    try:
        return pq.read_table(source(path), columns=list(chainwalk.LINK))
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None  # (check_part says why)
