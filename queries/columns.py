"""The columns the views scan, as DuckDB types: every kind's (the envelope's, then its typed payload
columns: `runledger.ledger.storage.store.arrow_schema`, from the models of `runledger.ledger.contract.events`) and the quarantine's.

Reading them from the contract loads pydantic and pyarrow, a third of a second; so that a query
(`runledger sql`) starts without them, the answer is kept in the user's cache folder
(`runledger.ledger.settings.cache_dir`) under the digest of the source of `ledger/`
and of this file, and worked out again from the contract whenever that source changes. A cache
file that is not exactly what this module writes is ignored.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
from pathlib import Path

from runledger import ledger
from runledger.ledger import settings

ARROW_TO_DUCK = {
    "string": "VARCHAR", "int64": "BIGINT", "double": "DOUBLE", "bool": "BOOLEAN", "binary": "BLOB",
    "timestamp[us, tz=UTC]": "TIMESTAMPTZ", "map<string, double>": "MAP(VARCHAR, DOUBLE)",
    "map<string, string>": "MAP(VARCHAR, VARCHAR)",
}
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")  # a kind's or a column's name, safe to write into SQL
Columns = list[tuple[str, str]]  # (name, DuckDB type), in the stored order


@functools.cache
def layout() -> dict:
    """{"kinds": {kind: Columns}, "envelope": [name, ...], "quarantine": Columns, "views": {kind: view}}."""
    sources = sorted(Path(ledger.__file__).parent.glob("*.py")) + [Path(__file__)]
    digest = hashlib.sha256(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sources)).hexdigest()[:32]
    cache = settings.cache_dir() / f"columns-{digest}.json"
    try:
        found = json.loads(cache.read_text())
        if _well_formed(found):
            return found
    except (OSError, ValueError):
        pass
    made = _from_contract()
    try:  # written whole (temp file, rename) or not at all: another process may read it meanwhile
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{secrets.token_hex(4)}")
        tmp.write_text(json.dumps(made))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home: worked out again next time
    return made


def kind_columns(kind: str) -> Columns:
    """The columns of one kind's files: the envelope's, then its typed payload columns."""
    return [tuple(c) for c in layout()["kinds"][kind]]


def kinds() -> list[str]:
    """Every kind of the registry (`runledger.ledger.contract.events.KINDS`), in its order."""
    return list(layout()["kinds"])


def kind_views() -> dict[str, str]:
    """Each kind's SQL view (`runledger.ledger.contract.events.VIEWS`: runs, steps_all, ...)."""
    return dict(layout()["views"])


def envelope_columns() -> list[str]:
    return list(layout()["envelope"])


def quarantine_columns() -> Columns:
    return [tuple(c) for c in layout()["quarantine"]]


def _from_contract() -> dict:
    from runledger.ledger.contract.events import KINDS, VIEWS
    from runledger.ledger.storage.rows import ENVELOPE_SCHEMA, QUARANTINE_SCHEMA, arrow_schema

    def duck(schema) -> Columns:
        return [[f.name, ARROW_TO_DUCK[str(f.type)]] for f in schema]

    return {"kinds": {k: duck(arrow_schema(k)) for k in KINDS}, "envelope": [n for n, _ in ENVELOPE_SCHEMA],
            "quarantine": duck(QUARANTINE_SCHEMA), "views": VIEWS}


def _well_formed(found) -> bool:
    types = set(ARROW_TO_DUCK.values())

    def columns_ok(cols) -> bool:
        return isinstance(cols, list) and all(
            isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and _NAME.match(c[0]) and c[1] in types
            for c in cols)

    return (isinstance(found, dict) and set(found) == {"kinds", "envelope", "quarantine", "views"}
            and isinstance(found["kinds"], dict) and found["kinds"]
            and all(isinstance(k, str) and _NAME.match(k) and columns_ok(c) for k, c in found["kinds"].items())
            and isinstance(found["envelope"], list) and all(isinstance(n, str) and _NAME.match(n) for n in found["envelope"])
            and columns_ok(found["quarantine"])
            and isinstance(found["views"], dict) and set(found["views"]) == set(found["kinds"])
            and all(isinstance(v, str) and _NAME.match(v) for v in found["views"].values()))
