"""The columns the views scan, as DuckDB types: every kind's (the envelope's, then its typed payload
columns: `runledger.ledger.storage.rows.arrow_schema`, from the models of `runledger.ledger.contract.events`) and the quarantine's.

Reading them from the contract loads pydantic and pyarrow, a third of a second; so that a query
(`runledger sql`) starts without them, they are worked out when the contract changes and kept in
`runledger.queries.columns_made` (`python -m runledger.queries.columns` writes it; a test checks it is
current), under the digest of the sources they come from (`source_digest`). If that digest is not the
sources' own, they are worked out from the contract instead, each time.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from runledger import ledger

ARROW_TO_DUCK = {
    "string": "VARCHAR", "int64": "BIGINT", "double": "DOUBLE", "bool": "BOOLEAN", "binary": "BLOB",
    "timestamp[us, tz=UTC]": "TIMESTAMPTZ", "map<string, double>": "MAP(VARCHAR, DOUBLE)",
    "map<string, string>": "MAP(VARCHAR, VARCHAR)",
}
Columns = list[tuple[str, str]]  # (name, DuckDB type), in the stored order


MADE = Path(__file__).with_name("columns_made.py")


def source_digest() -> str:
    """The digest of the sources the columns come from: the contract, the writer's schemas, this file."""
    here = Path(ledger.__file__).parent
    sources = sorted((here / "contract").glob("*.py")) + [here / "storage" / "rows.py", Path(__file__)]
    return hashlib.sha256(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sources)).hexdigest()[:32]


@functools.cache
def layout() -> dict:
    """{"kinds": {kind: Columns}, "envelope": [name, ...], "quarantine": Columns, "views": {kind: view}}."""
    from runledger.queries import columns_made

    if columns_made.DIGEST == source_digest():
        return json.loads(columns_made.LAYOUT)
    return _from_contract()  # (the sources changed since columns_made was written: `python -m runledger.queries.columns`)


def write_made() -> None:
    """Write columns_made.py from the contract (after a change to the sources, see source_digest)."""
    made = _from_contract()  # as JSON text (compiled and read faster than a literal), a line per kind
    text = "{\n" + ",\n".join(
        f" {json.dumps(key)}: " + ("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()) + "\n }"
                                   if isinstance(value, dict) else json.dumps(value))
        for key, value in made.items()) + "\n}"
    MADE.write_text(f'"""The views\' columns, worked out from the contract (written by `python -m runledger.queries.columns`:\n'
                    f'do not edit)."""\n\nDIGEST = {source_digest()!r}\nLAYOUT = r"""\n{text}\n"""\n')


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


if __name__ == "__main__":
    write_made()
