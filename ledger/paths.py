"""The files of a root that a reader reads: the one pattern of stored event files and of quarantined
input (`ledger.store` writes them; the SQL views, `verify`, replay and the ledger read exactly these).
Only the standard library is imported here, so that a query can find its files without loading Arrow.
"""

from __future__ import annotations

from pathlib import Path


def event_glob(root: Path, kind: str | None = None, run_id: str | None = None) -> Path:
    """The one pattern of stored event files: the SQL views, `verify`, replay and the ledger all read
    exactly the files it matches (anything else under events/ is a stray file, and `verify` says so)."""
    return Path(root) / "events" / f"kind={kind or '*'}" / f"run_id={run_id or '*'}" / "*.parquet"


def quarantine_glob(root: Path) -> Path:
    return Path(root) / "quarantine" / "*.parquet"


def _matching(pattern: Path) -> list[Path]:
    return sorted(Path(pattern.anchor).glob(str(pattern.relative_to(pattern.anchor))))


def event_files(root: Path, kind: str | None = None, run_id: str | None = None) -> list[Path]:
    return _matching(event_glob(root, kind, run_id))


def quarantine_files(root: Path) -> list[Path]:
    return _matching(quarantine_glob(root))
