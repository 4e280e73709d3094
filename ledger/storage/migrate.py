"""`runledger migrate`: a root in the plain layout of before the tables becomes Iceberg tables.

Holding the root's lock (no ledger serves it meanwhile), after `verify` finds no problem:
1. each event and quarantine file is rewritten in place, atomically, with the tables' field ids (the
   same rows, the same name, the same digest), so a reader of the plain layout sees the same rows;
2. every file is committed to its table, in one ledger commit;
3. `tables.json` is written: from then on readers read the tables' snapshot;
4. `verify` runs again, and must find the same events, chains and heads.
A crash before step 3 leaves a plain root that reads as before; running the command again starts over.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from runledger.ledger.storage import locks, paths, store
from runledger.ledger.check.verify import verify


class NotMigrated(RuntimeError):
    """The root was not migrated (the reason is the message)."""


def migrate(root: str | Path, check: bool = True) -> dict:
    """Migrate `root` (see the module docstring); returns what was done. Raises NotMigrated.
    `check=False` skips both verifies (only for benches, whose synthetic rows verify would refuse)."""
    root = Path(root).resolve()
    if paths.is_tables(root):
        return {"migrated": False, "reason": "the root keeps its events as tables already"}
    if not paths.is_plain(root):
        raise NotMigrated(f"{root} holds no ledger")
    with locks.hold(root / "ledger.lock", f"ledger root {root}"):
        store.recover(root)  # (a plain root: finishes an interrupted compaction)
        before = verify(root) if check else None
        if before is not None and not before.ok:
            raise NotMigrated(f"verify found {len(before.problems)} problem(s) before migrating (first: "
                              f"{before.problems[0]}); run `runledger verify --root {root}`")
        from runledger.ledger.storage.tables import Tables, drop_tables

        drop_tables(root)  # what a migration that died before its end left, read by no one

        tables = Tables(root, mark=False)
        files: dict[str, list[Path]] = defaultdict(list)
        for path in store.event_files(root):
            files[path.parent.parent.name.removeprefix("kind=")].append(path)
        files[paths.QUARANTINE] = store.quarantine_files(root)
        for name, listed in files.items():
            for path in listed:
                store.write_atomic(tables.with_field_ids(name, pq.read_table(path)), path)
        commit = tables.commit(files)
        tables.mark()
        store.forget_tables(root)
        if not check:
            return {"migrated": True, "events": None, "chains": None, "files": sum(map(len, files.values())),
                    "commit": commit}
        after = verify(root)
    same = (after.events, after.chains, after.heads) == (before.events, before.chains, before.heads)
    if not after.ok or not same:
        raise NotMigrated(f"verify after migrating differs: {after.events} events and {after.chains} chains "
                          f"(before: {before.events}, {before.chains}); problems: {after.problems[:3]}")
    return {"migrated": True, "events": after.events, "chains": after.chains, "files": sum(map(len, files.values())),
            "commit": commit}


