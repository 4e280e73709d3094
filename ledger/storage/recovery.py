"""A root made consistent after a crash: temp files dropped, and the files no commit took."""

from __future__ import annotations

from pathlib import Path

from runledger.ledger.storage.store import tables_of


def recover(root: Path) -> dict[str, int]:
    """Make the root consistent after a crash (call holding the root's lock): drop temp files, and the
    files no commit took."""
    root = Path(root)
    removed_tmp = 0
    for tmp in list(root.glob("events/*/*/.*.tmp")) + list(root.glob("quarantine/.*.tmp")):
        tmp.unlink(missing_ok=True)
        removed_tmp += 1
    return {"temp_files_removed": removed_tmp, "uncommitted_files_removed": tables_of(root).remove_orphans()}
