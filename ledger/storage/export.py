"""An export of a root's runs to a folder another engine reads without runledger: `runledger export`.

Parquet: the stored files of one snapshot of the tables, byte for byte, in the layout they are stored in
(`events/kind=K/run_id=R/*.parquet`): every envelope column, the canonical `payload` text, the typed
payload columns, `stream_seq`, `ingested_at` and the ledger's digest of its own columns. So anyone
recomputes every hash from the export alone (`runledger verify --root DIR`: runledger.ledger.check.exported).
CSV: one file per stored file, its envelope columns, `payload` (the canonical text, from which each typed
column comes), `stream_seq` and `ingested_at` (a CSV has no MAP or LIST columns).

Beside the files, `export.json` (MANIFEST): where and when the export was made, the snapshot (ledger
commit) it holds, each file's SHA-256 and rows, and where each chain of the runs exported ends (its last seq
and hash, as `runledger verify` of the root holds them to the heads the ledger recorded), so a check of the
export also finds a chain cut short.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from runledger.ledger.storage import objects, paths

MANIFEST = "export.json"
FORMAT = "runledger-export"
VERSION = 1
FORMATS = ("parquet", "csv")
CSV_COLUMNS = ("event_id", "run_id", "producer", "attempt", "seq", "kind", "time", "step", "schema_version",
               "prev_hash", "hash", "payload", "stream_seq", "ingested_at")


class ExportRefused(ValueError):
    """An export that cannot be made (nothing to export, a folder that is not empty); one line."""


@dataclass
class Exported:
    runs: list[str]
    files: int
    rows: int
    bytes: int
    seconds: float


def is_export(folder: str | Path) -> bool:
    """Whether `folder` holds an export (its MANIFEST)."""
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder: str | Path) -> dict:
    """The export's MANIFEST; ValueError (one line) if it is not one."""
    try:
        doc = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{Path(folder) / MANIFEST}: not an export's manifest ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{Path(folder) / MANIFEST}: not a {FORMAT} manifest of version {VERSION}")
    return doc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def export(root: str | Path, out: str | Path, runs: list[str] | None = None, fmt: str = "parquet",
           snapshot: int | None = None) -> Exported:
    """Export `runs` (None: every run) of `root`'s snapshot `snapshot` (None: the current one) into the empty or
    new folder `out` as `fmt` (see the module docstring)."""
    import pyarrow.parquet as pq

    started = time.monotonic()
    root, out = Path(root), Path(out)
    if fmt not in FORMATS:
        raise ExportRefused(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    paths.check_root(root)
    if not paths.is_tables(root):
        raise ExportRefused(f"nothing is stored under {root} yet")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportRefused(f"--out {out} is not an empty folder (an export never mixes with other files)")
    at = paths.cut(root, snapshot)
    if why := at.refusal():
        raise paths.NotALedger(f"{root}: {why}")
    files = paths.event_files(root, at=at)
    stored_runs = sorted({f.parent.name.removeprefix("run_id=") for f in files})
    wanted = stored_runs if runs is None else runs
    missing = sorted(set(wanted) - set(stored_runs))
    if missing:
        raise ExportRefused(f"no events of run {missing[0]!r} under {root}" + (f" (nor of {len(missing) - 1} more)"
                                                                            if len(missing) > 1 else ""))
    files = [f for f in files if f.parent.name.removeprefix("run_id=") in set(wanted)]
    named = objects.warehouse_of(root)
    base = objects.ObjectPath(named["warehouse"]) if named else root  # (the tables' files: in a bucket, or under the root)
    out.mkdir(parents=True, exist_ok=True)
    listed, total_rows, total_bytes = [], 0, 0
    for f in files:
        rel = f.relative_to(base)
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            _copy(f, target)
            rows = pq.ParquetFile(target).metadata.num_rows
        else:
            target = target.with_suffix(".csv")
            rows = _write_csv(f, target)
        size = target.stat().st_size
        listed.append({"path": str(target.relative_to(out)), "sha256": _sha256(target), "rows": rows, "bytes": size})
        total_rows, total_bytes = total_rows + rows, total_bytes + size
    manifest = {
        "format": FORMAT, "version": VERSION, "files_format": fmt, "source": str(root.resolve()), "snapshot": at.commit,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": wanted,
        "files": listed,
        "heads": _heads(files),
    }
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / MANIFEST)
    return Exported(wanted, len(listed), total_rows, total_bytes, time.monotonic() - started)


def _copy(stored, target: Path) -> None:
    """A stored file's bytes into `target`: a local copy, or the object read from its bucket."""
    if not objects.is_object(stored):
        shutil.copyfile(stored, target)
        return
    with stored.open("rb") as src, open(target, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)


def _write_csv(stored: Path, target: Path) -> int:
    """One stored file's envelope columns, canonical payload text, stream_seq and ingested_at as CSV; its rows."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(objects.source(stored))
    columns = [c for c in CSV_COLUMNS if c in pf.schema_arrow.names]
    rows = 0
    with pcsv.CSVWriter(target, _csv_schema(pf, columns)) as w:
        for batch in pf.iter_batches(columns=columns):
            w.write_batch(batch)
            rows += batch.num_rows
    return rows


def _csv_schema(pf, columns: list[str]):
    import pyarrow as pa

    return pa.schema([pf.schema_arrow.field(c) for c in columns])


def _heads(files: list[Path]) -> dict[str, list[dict]]:
    """Each chain's last event in `files`: run -> [{producer, attempt, seq, hash}]."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: dict[str, list[dict]] = {}
    tables = [pq.read_table(objects.source(f), columns=["run_id", "producer", "attempt", "seq", "hash"]) for f in files]
    if not tables:
        return out
    links = pa.concat_tables(tables)
    agg = links.group_by(["run_id", "producer", "attempt"]).aggregate([("seq", "max")])
    last = pa.table({"run_id": agg["run_id"], "producer": agg["producer"], "attempt": agg["attempt"], "seq": agg["seq_max"]})
    ends = links.join(last, keys=["run_id", "producer", "attempt", "seq"], join_type="inner")
    for row in sorted(ends.to_pylist(), key=lambda r: (r["run_id"], r["producer"], r["attempt"])):
        out.setdefault(row["run_id"], []).append({k: row[k] for k in ("producer", "attempt", "seq", "hash")})
    return out
