"""The root of a partitioned ledger: shared by its instances (never with a single ledger), its layout
(K, recorded once), and its tables' catalog, opened before any takeover."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from runledger.ledger.storage import store
from runledger.ledger.storage.stored import STATUS_DIR

log = logging.getLogger(__name__)

CATALOG_TRIES = 30  # a second apart: a catalog server being started, or made by another instance


class SharedRoot:
    """A shared hold on the root's ledger lock: partitioned instances share the root with each other,
    never with a single ledger (which holds the same file exclusively; see runledger.ledger.storage.locks)."""

    def __init__(self, root: Path, k: int) -> None:
        from runledger.ledger.storage.locks import Busy

        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(root / "ledger.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise Busy(f"ledger root {root} is in use by a single (unpartitioned) ledger") from None
        layout = root / STATUS_DIR / "layout.json"
        layout.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(layout, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump({"partitions": k, "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}, f)
        except FileExistsError:
            pass
        recorded = json.loads(layout.read_text() or "{}").get("partitions", k)
        if recorded != k:
            self.release()
            raise Busy(f"ledger root {root} is served in {recorded} partitions, not {k} (stop every instance "
                       f"and remove {layout} to change it)")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def layout(root: Path) -> int | None:
    """The number of partitions the root is served in, or None (a single ledger)."""
    try:
        return int(json.loads((Path(root) / STATUS_DIR / "layout.json").read_text())["partitions"])
    except (OSError, ValueError, KeyError):
        return None


def catalog_of(root: Path) -> str | None:
    """The shared catalog a root's tables are in (named in the root by `use_catalog`), or None (sqlite)."""
    from runledger.ledger.storage.paths import CATALOG_URI_FILE

    try:
        return (Path(root) / CATALOG_URI_FILE).read_text().strip() or None
    except OSError:
        return None


def use_catalog(root: Path, uri: str) -> None:
    """Write the root's tables to the catalog at `uri` (a SQLAlchemy URI: a shared PostgreSQL, say),
    and name it in the root for its readers (`catalog.uri`, for this user only, 0600: a URI may hold
    a password, though one is better kept out of it: libpq reads ~/.pgpass). The root is named there only
    once the catalog opened and holds this root's tables, or none (a catalog made for this root, while
    the root's own catalog holds none either): anything else is refused (paths.NotALedger, one line)
    with the root as it was, for a catalog named in error would leave its readers reading another
    root's tables, or none."""
    from runledger.ledger.storage import paths
    from runledger.ledger.bus.natsserver import write_private
    from runledger.ledger.storage.tables import Tables

    root = Path(root)
    shown = paths.shown_uri(uri)
    rows = _catalog_rows_when_up(root, uri, shown)
    named = root / paths.CATALOG_URI_FILE
    current = catalog_of(root)
    own = current or (f"sqlite:///{root / paths.CATALOG_FILE}" if (root / paths.CATALOG_FILE).exists() else None)
    if not rows and own is not None and own != uri:
        try:
            held = paths.roots_catalog_rows(root, own)
        except Exception:  # (a catalog that does not open holds nothing this root could lose)
            held = None
        if held:
            raise paths.NotALedger(f"{root}: catalog {shown} holds no tables, and this root's are in "
                                   f"{paths.shown_uri(current) if current else paths.CATALOG_FILE}: a root's "
                                   f"tables are not moved from one catalog to another")
    root.mkdir(parents=True, exist_ok=True)
    try:
        open_tables(root, lambda: Tables(root, uri=uri, mark=False), shown)
    except Exception as err:
        raise paths.NotALedger(f"{root}: catalog {shown} cannot be opened: {str(err).splitlines()[0][:200]}") from None
    if current != uri or named.stat().st_mode & 0o077:  # (a URI may carry a secret anywhere: kept private)
        write_private(named, uri + "\n")
    store.tables_of(root).mark()  # (readers read the tables once their catalog is named)


def _catalog_rows_when_up(root: Path, uri: str, shown: str) -> dict[str, str]:
    """paths.roots_catalog_rows, waiting up to CATALOG_TRIES seconds for a catalog's server that is
    not up yet; paths.NotALedger if it stays down."""
    from runledger.ledger.storage import paths

    for attempt in range(CATALOG_TRIES):
        try:
            return paths.roots_catalog_rows(root, uri)
        except paths.NotALedger:
            raise
        except Exception as err:
            if attempt == CATALOG_TRIES - 1:
                raise paths.NotALedger(f"{root}: catalog {shown} cannot be reached: "
                                       f"{str(err).splitlines()[0][:200]}") from None
            log.warning("catalog %s not ready (%s); trying again", shown, str(err).splitlines()[0][:200])
            time.sleep(1.0)
    return {}


def open_tables(root: Path, make=None, where: str = "") -> None:
    """Open the root's tables (`make()`, else store.tables_of's default), once the catalog is there:
    instances starting together race to create its tables and namespace, and one of them loses."""
    for attempt in range(CATALOG_TRIES):
        try:
            if make is None:
                store.tables_of(root)
            else:
                store.use_tables(root, make())  # (the cache `store.tables_of` reads)
            return
        except Exception as err:
            if attempt == CATALOG_TRIES - 1:
                raise
            log.warning("catalog %s not ready (%s); trying again", where or root, str(err).splitlines()[0][:200])
            time.sleep(1.0)
