"""The blobs that `media` events name (an image's or a file's bytes), kept once each by their SHA-256 at
`{root}/media/{sha256}` beside the tables, and checked against their names.

A blob is written whole to a temporary file in the same folder, synced, then renamed into place, before
the event naming it is sent (`runledger.values`), so an event never names a blob that is half there. One
blob serves every event that names its digest, of any run. `problems` (what `runledger verify` adds)
hashes each blob the stored `media` events name and names the one that is missing, is not a plain file
(a link may point anywhere), or whose bytes are not its digest's. Only the standard library here (and
pyarrow in `problems`): `runledger.values` writes blobs without loading more.

A root whose tables are on object storage (`runledger.ledger.storage.objects`) keeps its blobs beside them, at
`{warehouse}/media/{sha256}`: each written by one PUT (whole or not at all, as the rename gives on disk),
read, hashed, counted and removed there, so a blob is wherever its events' tables are, for every machine
that reads them. A blob in place is reused as it is; one older than half of GRACE_S is written again,
which dates it now (an object's time cannot be touched), so `remove_unheld` keeps it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import Callable

MEDIA_DIR = "media"  # the contract's MEDIA_DIR (runledger.ledger.contract.events)
GRACE_S = float(os.environ.get("RUNLEDGER_MEDIA_GRACE_S", 600.0))  # a blob written or reused this recently is kept by
# `remove_unheld` (its event may be in flight)
_HEX = frozenset("0123456789abcdef")
_CHUNK = 1 << 20


def folder(root: str | os.PathLike):
    """Where the root's blobs are: `media/` beside its tables (in the bucket of a warehouse on object
    storage, an ObjectPath; else under the root)."""
    if not (Path(root) / "warehouse.json").exists():  # (objects.WAREHOUSE_FILE: pyarrow only where one is named)
        return Path(root) / MEDIA_DIR
    from runledger.ledger.storage import objects

    named = objects.configure(Path(root))
    return objects.ObjectPath(named["warehouse"]) / MEDIA_DIR if named else Path(root) / MEDIA_DIR


def _object(path) -> bool:
    return not isinstance(path, Path)


def blob_path(root: str | os.PathLike, digest: str, where=None):
    """Where the blob of this SHA-256 is kept (a Path, or an ObjectPath in the root's bucket; `where`: the
    root's `folder`, if known); ValueError unless it is 64 lowercase hex digits (so that no name in an event
    can point anywhere else)."""
    if not isinstance(digest, str) or len(digest) != 64 or not _HEX.issuperset(digest):
        raise ValueError(f"{str(digest)[:80]!r} is not a SHA-256 in lowercase hex")
    return (where or folder(root)) / digest


def store_bytes(root: str | os.PathLike, data: bytes) -> tuple[str, int]:
    """Keep `data` as a blob under the root; (its SHA-256, its size). A blob already in place is not written again."""
    digest = hashlib.sha256(data).hexdigest()
    final = blob_path(root, digest)
    if _object(final):
        if not _in_place(final, len(data)):
            final.write_bytes(data)
    elif not _in_place(final, len(data)):
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
    """Keep a file's bytes as a blob under the root, read once (hashed while copied); (its SHA-256, its size).
    Into a bucket it is read twice: hashed, then sent (an object's name is its digest, known only at the end)."""
    where = folder(root)
    if _object(where):
        with open(path, "rb") as src:
            digest = hashlib.file_digest(src, "sha256").hexdigest()
        size = os.path.getsize(path)
        target = where / digest
        if not _in_place(target, size):
            with open(path, "rb") as src, target.open("wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
        return digest, size
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
    as used now if so (an object written within half of GRACE_S: an older one is written again)."""
    if _object(path):
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        return st.st_size == size and time.time() - st.st_mtime_ns / 1e9 < GRACE_S / 2
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    return path.is_file() and not path.is_symlink() and st.st_size == size and _reused(path)


def digest_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _absent(path) -> bool:
    return not path.exists() if _object(path) else not os.path.lexists(path)


def _not_plain(path) -> bool:
    """A link or a folder where a blob should be (an object is always a plain one)."""
    return not _object(path) and (path.is_symlink() or not path.is_file())


def read_blob(root: Path, digest: str) -> bytes:
    """The bytes of the blob of `digest`: FileNotFoundError if it is missing, or not a plain file (a link may
    point anywhere)."""
    path = blob_path(root, digest)
    if _absent(path) or _not_plain(path):
        raise FileNotFoundError(str(path))
    return path.read_bytes()


def problems(root: Path, files: list[Path]) -> list[str]:
    """What is wrong with the blobs the `media` events in `files` name: each blob missing, not a plain file,
    of another size than its events say, or whose bytes' SHA-256 is not its name, named with the event
    that names it (the first, and how many more). Each blob is hashed once."""
    import pyarrow.parquet as pq

    from runledger.ledger.storage.objects import source

    named: dict[str, list[tuple[str, int]]] = {}
    out = []
    for f in files:
        try:
            t = pq.read_table(source(f), columns=["event_id", "sha256", "bytes"])
        except (OSError, ValueError):
            continue  # (the row check names a file that cannot be read)
        for event_id, digest, size in zip(*(t.column(c).to_pylist() for c in ("event_id", "sha256", "bytes"))):
            named.setdefault(digest, []).append((event_id, size))
    where = folder(root)
    for digest, events in sorted(named.items()):
        event_id = events[0][0] + (f" (and {len(events) - 1} more events)" if len(events) > 1 else "")
        try:
            path = blob_path(root, digest, where)
        except ValueError as err:
            out.append(f"{event_id}: names blob {err}")
            continue
        if _absent(path):
            out.append(f"{path}: the blob {event_id} names is missing (deleted?)")
        elif _not_plain(path):
            out.append(f"{path}: the blob {event_id} names is not a plain file (a link or a folder: planted?)")
        elif path.stat().st_size != events[0][1] or digest_of(path) != digest:
            out.append(f"{path}: the blob {event_id} names has changed (its bytes' SHA-256 is not its name)")
        elif any(size != events[0][1] for _, size in events):
            out.append(f"{path}: the events naming this blob disagree on its size ({event_id})")
    return out


def named(root: Path, run_id: str | None = None) -> dict[str, dict[str, int]]:
    """digest -> {run_id: the blob's size} for the blobs the stored media events (of `run_id`, or of every run) name."""
    import pyarrow.parquet as pq

    from runledger.ledger.storage.objects import source
    from runledger.ledger.storage.paths import event_files, is_tables

    out: dict[str, dict[str, int]] = {}
    if not is_tables(Path(root)):
        return out
    for f in event_files(Path(root), "media", run_id):
        t = pq.read_table(source(f), columns=["run_id", "sha256", "bytes"])
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
    files = _blobs(root)
    runs: dict[str, int] = {}
    held = named(Path(root))
    for digest, by in held.items():
        for run in by:
            runs[run] = runs.get(run, 0) + files.get(digest, 0)
    return {"blobs": len(files), "bytes": sum(files.values()), "runs": runs, "unnamed": len(set(files) - set(held))}


def _blobs(root: Path) -> dict[str, int]:
    """digest -> size of the blobs the root keeps."""
    where = folder(root)
    if _object(where):  # (one listing, which gives the sizes)
        from pyarrow import fs

        from runledger.ledger.storage import objects

        infos = objects.filesystem().get_file_info(fs.FileSelector(where.key, allow_not_found=True))
        return {i.base_name: i.size for i in infos if i.type == fs.FileType.File and not i.base_name.startswith(".")}
    return {p.name: p.stat().st_size for p in where.iterdir() if p.is_file() and not p.name.startswith(".")} \
        if where.is_dir() else {}


def remove_unheld(root: Path, digests: set[str] | list[str], grace_s: float = GRACE_S) -> tuple[list[str], list[str]]:
    """Remove those of `digests` (a deleted run's blobs) that nothing holds (see the module docstring): (removed,
    kept). Run after the run's rows left the tables."""
    held, waiting = set(named(Path(root))), spooled(Path(root))
    removed, kept = [], []
    where = folder(root)
    for digest in sorted(digests):
        path = blob_path(root, digest, where)
        try:
            recent = time.time() - (path.stat() if _object(path) else path.lstat()).st_mtime_ns / 1e9 < grace_s
        except FileNotFoundError:
            continue
        if digest in held or digest in waiting or recent:
            kept.append(digest)
        else:
            path.unlink()
            removed.append(digest)
    return removed, kept
