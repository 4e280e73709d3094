"""Metric names as column names: a StoredWide field's name `NAME` (`runledger.ledger.contract.events`: any text but controls)
is stored in the DOUBLE column `{field}/ESCAPED` (`metric_column`) and read back from it (`metric_name`;
in SQL the view macro `metric_key` of queries/views.sql), and its names past the column bound in the MAP
column `{field}/` (`narrow_column`). Escaping makes the column names unique under DuckDB's
case-insensitive identifiers and under Unicode normalisation. No pydantic or pyarrow: readers use it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_./-")
_PLAIN = re.compile(r"[a-z0-9_./-]+")
_ESCAPED = re.compile(r"(?:[a-z0-9_./-]|%[0-9a-f]{2})+")


def metric_column(field: str, name: str) -> str:
    """The DOUBLE column of a StoredWide field's name: `{field}/` and the name with every byte of its UTF-8
    outside [a-z0-9_./-] written %xx (lowercase hex), so that two names never share a column, whatever
    DuckDB's case-insensitive identifiers or Unicode normalisation make of them (`Loss`/`loss`, `café`
    composed or not, Cyrillic look-alikes). A plain lowercase name is its own column name."""
    if _PLAIN.fullmatch(name):
        return f"{field}/{name}"
    return field + "/" + "".join(chr(b) if b in _SAFE else f"%{b:02x}"
                                 for b in name.encode("utf-8", "surrogatepass"))


def metric_name(column: str) -> str:
    """The name a StoredWide field's column holds (`metric_column` undone; the view macro `metric_key`
    does the same in SQL). A column of a root written before names were escaped holds the name as
    logged; one that reads as escaped (only [a-z0-9_./-] and %xx) is decoded."""
    escaped = column.split("/", 1)[1]
    if _ESCAPED.fullmatch(escaped) and "%" in escaped:
        try:
            return unquote_to_bytes(escaped).decode("utf-8")
        except UnicodeDecodeError:
            pass
    return escaped


def narrow_column(field: str) -> str:
    """The MAP column (name -> value) of a StoredWide field's names that have no DOUBLE column: `{field}/`
    (no metric name is empty, so no name's column is this one)."""
    return f"{field}/"
