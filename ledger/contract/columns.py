"""What the payload models hold, as storage and the fast paths need it: each field's column type
(`payload_columns`, from which `runledger.ledger.storage.rows.arrow_schema` builds a kind's Parquet schema), the
float fields (`FLOAT_FIELDS`: an integer there must have an exact float64) and the kinds whose
payloads hold no free text (`NUMERIC_KINDS`). All derived from the models in `runledger.ledger.contract.events`.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Collection, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from runledger.ledger.contract.events import KINDS, Payload, StoredAsMap, StoredWide
from runledger.ledger.contract.metricnames import metric_column, narrow_column

_UNIONS = (Union, types.UnionType)  # `Optional[X]` and `X | None`


def _free_text_in(annotation: Any) -> bool:
    """Whether a value of this type can hold a string that may contain "." (not a dot-free Literal)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated or origin is list:
        return _free_text_in(args[0])
    if origin in _UNIONS:
        return any(_free_text_in(a) for a in args)
    if origin is Literal:
        return any(not isinstance(a, (int, bool)) and "." in str(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_free_text_in(f.annotation) for f in annotation.model_fields.values())
    return annotation not in (float, int, bool, type(None))


# Kinds whose payloads hold only numbers, booleans, null and dot-free Literal strings: with the
# envelope's strings (names, ids, hex, times, none holding ".0"), their text needs no walk to find
# integral floats (`runledger.ledger.contract.canonical.fast_canonical`).
NUMERIC_KINDS = frozenset(kind for kind, model in KINDS.items()
                          if not any(_free_text_in(f.annotation) for f in model.model_fields.values()))


def column_kind(annotation: Any) -> str:
    """'double' | 'bigint' | 'boolean' | 'varchar' | 'json' for a payload field's annotation."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return column_kind(get_args(annotation)[0])
    if origin in _UNIONS:
        args = [a for a in get_args(annotation) if a is not type(None)]
        return column_kind(args[0]) if len(args) == 1 else "json"
    if origin is Literal:
        return "varchar"
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "bigint"
    if annotation is float:
        return "double"
    if annotation is str:
        return "varchar"
    return "json"  # dicts, lists, nested models: stored as canonical JSON text


def field_column(f: FieldInfo) -> str:
    """A payload field's column kind: `column_kind` of its type; for a dict marked StoredAsMap,
    'map_double' | 'map_varchar' (a MAP column from names to values, which SQL reads without JSON); for
    one marked StoredWide, 'wide' (a DOUBLE column per name: `wide_columns`)."""
    if any(isinstance(m, StoredWide) for m in f.metadata):
        return "wide"
    if any(isinstance(m, StoredAsMap) for m in f.metadata):
        return "map_" + column_kind(get_args(f.annotation)[1])
    return column_kind(f.annotation)


# A StoredWide field's columns are bounded, so that what one run logs cannot make every commit and query of
# the table slower (Iceberg keeps every past schema: a column per name, unbounded, grows the table's
# metadata as the square of the names): the first WIDE_COLUMNS_MAX names of a table get a DOUBLE column
# each, and a run adds at most WIDE_COLUMNS_PER_RUN of them (counted by each ledger process); any other
# name is kept in the field's MAP column `{field}/` (name -> value, `narrow_column`), which every view
# reads alike. A run that logs more names than WIDE_COLUMNS_PER_RUN is warned, once (`runledger.log`).
WIDE_COLUMNS_MAX = 256
WIDE_COLUMNS_PER_RUN = 64
def wide_columns(field: str, payloads: list[dict], stored: Collection[str] | None = None) -> dict[str, list]:
    """The columns of a StoredWide field for these payloads: for every name any of them holds (in first-seen
    order) its DOUBLE column (`metric_column`), each value a float or None (absent, or not finite).
    `stored`: the columns the file holds (for the writer: may hold): a name whose column is not among
    them is in its column named with the raw name, if there is one (a file of a root written before
    names were escaped); else in the file's `narrow_column` if that is, as [(name, value), ...] per
    payload (None where it has none of them); else its column is expected all the same (and missing)."""
    names = {}
    for p in payloads:
        names.update(dict.fromkeys(p.get(field) or ()))
    narrow_col = narrow_column(field)
    columns, narrow = {}, set()
    for name in names:
        column = metric_column(field, name)
        if stored is not None and column not in stored:
            if f"{field}/{name}" in stored:
                column = f"{field}/{name}"
            elif narrow_col in stored:
                narrow.add(name)
                continue
        columns[column] = name
    out = {column: [(None if (v := (p.get(field) or {}).get(name)) is None else float(v)) for p in payloads]
           for column, name in columns.items()}
    if stored is not None and narrow_col in stored:
        out[narrow_col] = [[(n, None if v is None else float(v)) for n, v in (p.get(field) or {}).items() if n in narrow]
                           or None for p in payloads]
    return out


def payload_columns(kind: str) -> dict[str, str]:
    """Typed payload columns of a kind: field name -> column kind (see `field_column`)."""
    return {name: field_column(f) for name, f in KINDS[kind].model_fields.items()}


def float_fields(model: type[Payload]) -> list[tuple[str, bool]]:
    """(name, whether a dict of floats) for each field stored in a float column, or a dict of floats."""
    def has_float(a: Any) -> bool:
        return a is float or any(has_float(x) for x in get_args(a))

    out = []
    for name, f in model.model_fields.items():
        a = f.annotation
        if get_origin(a) is dict:
            out += [(name, True)] if has_float(get_args(a)[1]) else []
        elif has_float(a) and column_kind(a) == "double":
            out.append((name, False))
    return out


FLOAT_FIELDS = {kind: float_fields(model) for kind, model in KINDS.items()}
