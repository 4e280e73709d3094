"""How far a root's ledger has taken the stream (`ledger.position`, and what it stored), and the
root's identity (`ledger.id`), to which the ledger's consumer is tied."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from runledger.ledger.storage.files import fsync_dir
from runledger.ledger.storage.paths import POSITION_FILE, event_files, quarantine_files
from runledger.ledger.storage.objects import source


def taken_upto(root: Path) -> int:
    """The last stream seq the root's ledger has taken: what it stored, quarantined or recorded acking."""
    last = [read_position(root)]
    for files, column in ((event_files(root), "stream_seq"), (quarantine_files(root), "stream_seq")):
        for f in files:
            t = pq.read_table(source(f), columns=[column])
            if t.num_rows:
                last.append(pc.max(t.column(0)).as_py())
    return max(last)


def read_position(root: Path) -> int:
    try:
        return int((Path(root) / POSITION_FILE).read_text())
    except (OSError, ValueError):
        return 0


def write_position(root: Path, stream_seq: int) -> None:
    """Record that the ledger is about to ack messages up to `stream_seq` (all stored or quarantined),
    so that a consumer someone else moved past them is noticed at the next start. Not fsync'd: it
    survives a process kill; after a power loss, a stale value errs toward refusing to start."""
    tmp = Path(root) / f".{POSITION_FILE}.tmp"
    tmp.write_text(str(stream_seq))
    os.replace(tmp, Path(root) / POSITION_FILE)


def root_id(root: Path) -> str:
    """This root's identity (random, made on first use): the ledger's consumer is tied to it."""
    path = Path(root) / "ledger.id"
    if not path.exists():
        tmp = path.with_name(f".ledger.id.{secrets.token_hex(4)}.tmp")
        tmp.write_text(secrets.token_hex(16))
        try:
            os.link(tmp, path)  # first writer wins; a racing one reads the winner's id
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        fsync_dir(Path(root))
    return path.read_text().strip()
