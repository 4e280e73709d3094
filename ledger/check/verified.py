"""What a verify that passed checked, kept for the next one to start from (`runledger verify --record
FILE`, `--since FILE`): each events file's SHA-256 and rows, and each chain's last seq and hash.

The record lives where the auditor keeps it, not in the root: it is what a later check holds the
root to, as the heads `verify` prints are. A file's name is its path under the root; when the root
is read through table snapshots (the table-format issue), a snapshot id can join the file set.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from runledger.ledger.check.chainwalk import Key

VERSION = 1


@dataclass(frozen=True)
class FileChecked:
    sha256: str
    rows: int
    size: int | None = None  # bytes and mtime when checked: `verify --since F --assume-unchanged` reads a
    mtime_ns: int | None = None  # file again only if either differs (records before these: always)


@dataclass
class Record:
    written_at: str
    events: int
    files: dict[str, FileChecked] = field(default_factory=dict)  # path under the root -> what it held
    chains: dict[Key, tuple[int, str]] = field(default_factory=dict)  # chain -> (last seq, its hash)

    @classmethod
    def of(cls, root: Path, events: int, files: dict[Path, tuple[str, int, int, int]],
           chains: dict[Key, tuple[int, str]]) -> "Record":
        """`files`: path -> (sha256, rows, size, mtime_ns)."""
        now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        return cls(now, events, {name_of(root, f): FileChecked(*v) for f, v in sorted(files.items())}, dict(chains))

    def to_json(self) -> dict:
        return {"version": VERSION, "written_at": self.written_at, "events": self.events,
                "files": [{"name": n, "sha256": f.sha256, "rows": f.rows, "size": f.size, "mtime_ns": f.mtime_ns}
                          for n, f in sorted(self.files.items())],
                "chains": [{"run_id": r, "producer": p, "attempt": a, "seq": s, "hash": h}
                           for (r, p, a), (s, h) in sorted(self.chains.items())]}

    @classmethod
    def from_json(cls, doc: dict) -> "Record":
        if doc.get("version") != VERSION:
            raise ValueError(f"a verify record of version {doc.get('version')!r}, not {VERSION}")
        return cls(doc["written_at"], int(doc["events"]),
                   {f["name"]: FileChecked(f["sha256"], int(f["rows"]), f.get("size"), f.get("mtime_ns")) for f in doc["files"]},
                   {(c["run_id"], c["producer"], int(c["attempt"])): (int(c["seq"]), c["hash"]) for c in doc["chains"]})


def name_of(root: Path, path: Path) -> str:
    return Path(path).relative_to(root).as_posix()


def read(path: str | Path) -> Record:
    """Raises OSError if it cannot be read, ValueError if it is not a verify record."""
    try:
        return Record.from_json(json.loads(Path(path).read_text()))
    except (KeyError, TypeError) as err:
        raise ValueError(f"not a verify record ({type(err).__name__}: {err})") from None


def write(path: str | Path, record: Record) -> None:
    """Replace the record at `path` atomically (temp file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(record.to_json(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
