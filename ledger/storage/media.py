"""The blobs that `media` events name (an image's or a file's bytes), kept once each by their SHA-256 at
`{root}/media/{sha256}` beside the tables, and checked against their names.

A blob is written whole to a temporary file in the same folder, synced, then renamed into place, before
the event naming it is sent (`runledger.values`), so an event never names a blob that is half there. One
blob serves every event that names its digest, of any run. `problems` (what `runledger verify` adds)
hashes each blob the stored `media` events name and names the one that is missing, is not a plain file
(a link may point anywhere), or whose bytes are not its digest's. Only the standard library here (and
pyarrow in `problems`): `runledger.values` writes blobs without loading more.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Callable

MEDIA_DIR = "media"  # the contract's MEDIA_DIR (runledger.ledger.contract.events)
GRACE_S = 600.0  # a blob written or reused this recently is kept by `remove_unheld` (its event may be in flight)
_HEX = frozenset("0123456789abcdef")
_CHUNK = 1 << 20


def blob_path(root: str | os.PathLike, digest: str) -> Path:
    """Where the blob of this SHA-256 is kept; ValueError unless it is 64 lowercase hex digits (so that no
    name in an event can point anywhere else)."""
    if not isinstance(digest, str) or len(digest) != 64 or not _HEX.issuperset(digest):
        raise ValueError(f"{str(digest)[:80]!r} is not a SHA-256 in lowercase hex")
    return Path(root) / MEDIA_DIR / digest


def store_bytes(root: str | os.PathLike, data: bytes) -> tuple[str, int]:
    """Keep `data` as a blob under the root; (its SHA-256, its size). A blob already in place is not written again."""
    digest = hashlib.sha256(data).hexdigest()
    final = blob_path(root, digest)
    if not _in_place(final, len(data)):
        _write(final.parent, lambda f: f.write(data), lambda: final)
    return digest, len(data)


def _reused(path: Path) -> bool:
    """Mark a blob in place as used now (`remove_unheld` keeps one used within GRACE_S); True."""
    try:
        os.utime(path)
    except OSError:
        pass
    return True


def store_file(root: str | os.PathLike, path: str | os.PathLike) -> tuple[str, int]:
    """Keep a file's bytes as a blob under the root, read once (hashed while copied); (its SHA-256, its size)."""
    h, size = hashlib.sha256(), [0]

    def copy(out) -> None:
        with open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
                size[0] += len(chunk)

    def final() -> Path | None:
        target = blob_path(root, h.hexdigest())
        return None if _in_place(target, size[0]) else target

    _write(Path(root) / MEDIA_DIR, copy, final)
    return h.hexdigest(), size[0]


def _write(folder: Path, write: Callable, final: Callable[[], Path | None]) -> None:
    """Write a temporary file in `folder`, sync it, and rename it to `final()` (None: not needed, dropped)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".tmp-{secrets.token_hex(8)}"
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        target = final()
        if target is None:
            tmp.unlink()
            return
        os.replace(tmp, target)  # whole or not at all: a reader never sees half a blob
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _in_place(path: Path, size: int) -> bool:
    """Whether a blob is already there: a plain file of that size (one edited since is verify's to name); marked
    as used now if so."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    return path.is_file() and not path.is_symlink() and st.st_size == size and _reused(path)


def digest_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def problems(root: Path, files: list[Path]) -> list[str]:
    """What is wrong with the blobs the `media` events in `files` name: each blob missing, not a plain file,
    of another size than its events say, or whose bytes' SHA-256 is not its name, named with the event
    that names it (the first, and how many more). Each blob is hashed once."""
    import pyarrow.parquet as pq

    named: dict[str, list[tuple[str, int]]] = {}
    out = []
    for f in files:
        try:
            t = pq.read_table(f, columns=["event_id", "sha256", "bytes"])
        except (OSError, ValueError):
            continue  # (the row check names a file that cannot be read)
        for event_id, digest, size in zip(*(t.column(c).to_pylist() for c in ("event_id", "sha256", "bytes"))):
            named.setdefault(digest, []).append((event_id, size))
    for digest, events in sorted(named.items()):
        event_id = events[0][0] + (f" (and {len(events) - 1} more events)" if len(events) > 1 else "")
        try:
            path = blob_path(root, digest)
        except ValueError as err:
            out.append(f"{event_id}: names blob {err}")
            continue
        if not os.path.lexists(path):
            out.append(f"{path}: the blob {event_id} names is missing (deleted?)")
        elif path.is_symlink() or not path.is_file():
            out.append(f"{path}: the blob {event_id} names is not a plain file (a link or a folder: planted?)")
        elif path.stat().st_size != events[0][1] or digest_of(path) != digest:
            out.append(f"{path}: the blob {event_id} names has changed (its bytes' SHA-256 is not its name)")
        elif any(size != events[0][1] for _, size in events):
            out.append(f"{path}: the events naming this blob disagree on its size ({event_id})")
    return out


def named(root: Path, run_id: str | None = None) -> dict[str, dict[str, int]]:
    """digest -> {run_id: the blob's size} for the blobs the stored media events (of `run_id`, or of every run) name."""
    import pyarrow.parquet as pq

    from runledger.ledger.storage.paths import event_files, is_tables

    out: dict[str, dict[str, int]] = {}
    if not is_tables(Path(root)):
        return out
    for f in event_files(Path(root), "media", run_id):
        t = pq.read_table(f, columns=["run_id", "sha256", "bytes"])
        for run, digest, size in zip(*(t.column(c).to_pylist() for c in ("run_id", "sha256", "bytes"))):
            out.setdefault(digest, {})[run] = size
    return out


def spooled(root: Path) -> set[str]:
    """The digests media events waiting in the root's spool name (sent or not: the ledger may not have them yet)."""
    import json

    from runledger.ledger.settings import spool_dir

    found = set()
    for seg in spool_dir(root).glob("*/*/*/seg-*.jsonl"):
        try:
            lines = seg.read_bytes().splitlines()
        except OSError:
            continue
        for line in lines:
            if b'"kind":"media"' in line:
                try:
                    found.add(json.loads(line)["payload"]["sha256"])
                except (ValueError, KeyError, TypeError):
                    continue
    return found


def usage(root: Path) -> dict:
    """{"blobs", "bytes": of the blob files under {root}/media, "runs": run_id -> bytes of the blobs its stored
    events name, "unnamed": blobs no stored event names}."""
    folder = Path(root) / MEDIA_DIR
    files = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")} \
        if folder.is_dir() else {}
    runs: dict[str, int] = {}
    held = named(Path(root))
    for digest, by in held.items():
        for run in by:
            runs[run] = runs.get(run, 0) + files.get(digest, 0)
    return {"blobs": len(files), "bytes": sum(files.values()), "runs": runs, "unnamed": len(set(files) - set(held))}


def remove_unheld(root: Path, digests: set[str] | list[str], grace_s: float = GRACE_S) -> tuple[list[str], list[str]]:
    """Remove those of `digests` (a deleted run's blobs) that nothing holds (see the module docstring): (removed,
    kept). Run after the run's rows left the tables."""
    import time

    held, waiting = set(named(Path(root))), spooled(Path(root))
    removed, kept = [], []
    for digest in sorted(digests):
        path = blob_path(root, digest)
        try:
            recent = time.time() - path.lstat().st_mtime < grace_s
        except FileNotFoundError:
            continue
        if digest in held or digest in waiting or recent:
            kept.append(digest)
        else:
            path.unlink()
            removed.append(digest)
    return removed, kept
