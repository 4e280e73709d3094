"""What the dashboard keeps in the user's cache folder (`runledger.ledger.settings.cache_dir`) between starts:
answers kept by the files they were read from (a file never changes once written; compaction writes new
ones), so that a restart, or a new file, costs only the new files. Lost, it is worked out again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from pathlib import Path

from runledger.ledger import settings

log = logging.getLogger(__name__)


def path(root: Path, prefix: str, version: str, suffix: str = ".json") -> Path:
    """Where one kind of answer (`prefix`, of the code's `version`) is kept for the ledger root `root`."""
    ident = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    return settings.cache_dir() / "ui" / f"{prefix}-{ident}-{version}{suffix}"


def write(path: Path, data, default=None) -> bool:
    """Keep `data` as JSON at `path`, written whole (temp file, rename) or not at all; True if it was."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        tmp.write_text(json.dumps(data, default=default))
        os.replace(tmp, path)
        return True
    except OSError as err:
        log.debug("%s is not kept (%s)", path.name, err)
        return False


def identity(f: Path) -> str:
    """A file's path, size and mtime (a file of the ledger never changes once written: this tells a new one)."""
    try:
        st = f.stat()
    except OSError:
        return str(f)
    return f"{f}:{st.st_size}:{st.st_mtime_ns}"
