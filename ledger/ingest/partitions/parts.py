"""A partition of a partitioned root: which runs are its, its consumer on the derived stream, its files.

`Part` is the position a partition's writer is given (runledger.ledger.ingest.position.Position): the
derived stream `RUNLEDGER_P{K}` through `ledger-p{p}`, its position in `{root}/partitions/k{K}-p{p}.position`,
its status record beside it, and recovery of its own runs' files only. `origin` reads a message of the
derived stream back as RUNLEDGER's (subject, data, seq).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX
from runledger.ledger.storage import store
from runledger.ledger.storage.stored import STATUS_DIR, partition_of

SOURCE_HEADER = "Nats-Stream-Source"


def parts_stream(k: int) -> str:
    return f"{STREAM}_P{k}"


def parts_prefix(k: int) -> str:
    return f"{SUBJECT_PREFIX}-p{k}"


def lease_bucket(k: int) -> str:
    return f"runledger-leases-k{k}"


@dataclass(frozen=True)
class Part:
    """Partition `p` of `k`: its consumer, its files under the root, and which runs are its (a Position)."""

    k: int
    p: int
    partitioned = True

    @property
    def name(self) -> str:
        return f"partition {self.p}"

    @property
    def stream(self) -> str:
        return parts_stream(self.k)

    @property
    def durable(self) -> str:
        return f"ledger-p{self.p}"

    @property
    def filter(self) -> str:
        return f"{parts_prefix(self.k)}.{self.p}.>"

    @property
    def key(self) -> str:
        return f"p{self.p}"

    def has(self, run_id: str) -> bool:
        return partition_of(run_id, self.k) == self.p

    def position_file(self, root: Path) -> Path:
        return Path(root) / STATUS_DIR / f"k{self.k}-p{self.p}.position"

    def status_file(self, root: Path) -> Path:
        return Path(root) / STATUS_DIR / f"k{self.k}-p{self.p}.json"

    def load(self, root: Path) -> int:
        try:
            return int(self.position_file(root).read_text())
        except (OSError, ValueError):
            return 0

    def save(self, root: Path, stream_seq: int) -> None:
        """The last RUNLEDGER seq this partition has taken (as positions.write_position, per partition)."""
        path = self.position_file(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(str(stream_seq))
        os.replace(tmp, path)

    def read_status(self, root: Path) -> dict:
        try:
            return json.loads(self.status_file(root).read_text())
        except (OSError, ValueError):
            return {}

    def update_status(self, root: Path, **fields) -> dict:
        """Merge `fields` into the partition's status record (written only by its writer)."""
        doc = self.read_status(root) | fields
        path = self.status_file(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
        return doc

    def recover(self, root: Path) -> dict[str, int]:
        """recovery.recover for this partition's runs only: their temp files and the files no commit took
        (a dead predecessor's). Other partitions' files may be in flight: they are left alone."""
        root = Path(root)
        temp = [t for t in root.glob("events/*/*/.*.tmp") if self._mine(t.parent)]
        for t in temp:
            t.unlink(missing_ok=True)
        from runledger.ledger.storage import paths

        store.tables_of(root)  # (made here if the root is new)
        orphans = [f for f in paths.uncommitted_files(root) if f.parent.name.startswith("run_id=") and self._mine(f.parent)]
        for f in orphans:
            f.unlink(missing_ok=True)
        return {"temp_files_removed": len(temp), "uncommitted_files_removed": len(orphans)}

    def unpack(self, msgs: list) -> list[tuple[str, bytes, int]]:
        return [origin(m) for m in msgs]

    def _mine(self, folder: Path) -> bool:
        return folder.name.startswith("run_id=") and self.has(folder.name.removeprefix("run_id="))


def origin(msg) -> tuple[str, bytes, int]:
    """(RUNLEDGER subject, data, RUNLEDGER stream seq) of a message of the partitioned stream, from its
    `Nats-Stream-Source` header ("RUNLEDGER <seq> <transforms> <subject> <id>")."""
    fields = (msg.headers or {}).get(SOURCE_HEADER, "").split(" ")
    if len(fields) >= 4 and fields[0] == STREAM and fields[1].isdigit():
        return fields[-2], msg.data, int(fields[1])
    raise ValueError(f"message {msg.subject} of the partitioned stream has no source header")

