"""The content hash of a file or a folder on this machine: what a `checkpoint` event (`Run.log_checkpoint`) and a
Levanter artifact record, so that anyone holding the same bytes can check them against the ledger.

A file's is its SHA-256. A folder's is the SHA-256 of its manifest: `sha256sum`'s lines ("HASH  RELATIVE/PATH\n")
for its files in path order, so `find . -type f | sort | xargs sha256sum | sha256sum` gives it too (paths without
the leading "./"); names, contents and layout count, timestamps and permissions do not.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def content_of(path: str | os.PathLike) -> dict:
    """{"bytes", "sha256"} of a local file; of a folder, with "files" (their count), the sha256 of its manifest.
    Raises FileNotFoundError for a path that is not on this machine."""
    p = Path(path)
    if p.is_file():
        with open(p, "rb") as f:
            return {"bytes": p.stat().st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
    if not p.is_dir():
        raise FileNotFoundError(f"{path}: no file or folder here")
    files = sorted((f for f in p.rglob("*") if f.is_file()), key=lambda f: f.relative_to(p).as_posix())
    manifest, size = [], 0
    for f in files:
        with open(f, "rb") as fh:
            manifest.append(f"{hashlib.file_digest(fh, 'sha256').hexdigest()}  {f.relative_to(p).as_posix()}\n")
        size += f.stat().st_size
    return {"bytes": size, "files": len(files), "sha256": hashlib.sha256("".join(manifest).encode()).hexdigest()}
