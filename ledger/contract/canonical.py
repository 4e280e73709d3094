"""Canonical JSON (RFC 8785, JCS) and the hash of an envelope: the reference writer, and orjson's fast path.

`canonical_json(value)` is the text every producer hashes alike (sorted keys by UTF-16 code units, no
whitespace, ECMAScript numbers: 3e-05 is written 0.00003). The reference writer is plain Python;
`fast_canonical` asks orjson (~10x faster) and takes its text only where it is sure to be the same
(tests/unit/test_events.py checks both against shared/contract-vectors.jsonl). `event_hash` is the
SHA-256 of an envelope's canonical text without `hash` (DESIGN.md, "Event envelope").
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from runledger.ledger.contract.events import InvalidEvent

try:  # a faster writer and parser for the ledger's hot path; the standard library's is the reference
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

_encode_str = json.encoder.c_encode_basestring or json.encoder.py_encode_basestring  # "..." like JSON.stringify


def es_number(x: float) -> str:
    """A float as ECMAScript's Number.prototype.toString writes it (JCS section 3.2.2.3)."""
    if x == 0:
        return "0"  # -0 as well
    r = repr(x)  # shortest round-trip digits: the same digits ECMAScript picks
    if "e" not in r and r[-1] != "n" and r[-1] != "f":  # 1e-4 <= |x| < 1e16: both write it positionally
        return r[:-2] if r.endswith(".0") else r
    if x != x or x in (math.inf, -math.inf):
        raise InvalidEvent("NaN/Infinity are not allowed (send null, with skipped=true for a loss)")
    if x < 0:
        return "-" + es_number(-x)
    mantissa, _, exp = r.partition("e")
    int_part, _, frac = mantissa.partition(".")
    s = int_part + frac
    stripped = s.lstrip("0")
    n = len(int_part) - (len(s) - len(stripped)) + int(exp)  # where the decimal point goes
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    head = digits[0] if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{'+' if e >= 0 else '-'}{abs(e)}"


_KEY_ORDERS: dict[tuple, tuple] = {}  # a dict's keys as given -> (sorted keys, their '"key":' prefixes)


def _key_order(obj: dict) -> tuple:
    given = tuple(obj)
    order = _KEY_ORDERS.get(given)
    if order is None:
        keys = sorted(given, key=lambda k: k.encode("utf-16-be"))  # JCS: by UTF-16 code units
        order = (keys, [_encode_str(k) + ":" for k in keys])
        if len(_KEY_ORDERS) < 4096:  # payloads repeat a few shapes; don't grow without bound
            _KEY_ORDERS[given] = order
    return order


def _canonical_dict(obj: dict) -> str:
    keys, prefixes = _key_order(obj)
    parts = []
    for k, prefix in zip(keys, prefixes):
        v = obj[k]
        write = _CANONICAL.get(type(v))
        if write is None:
            raise InvalidEvent(f"not a JSON value: {type(v).__name__}")
        parts.append(prefix + write(v))
    return "{" + ",".join(parts) + "}"


def _canonical_list(obj: list | tuple) -> str:
    return "[" + ",".join(canonical_json(v) for v in obj) + "]"


_CANONICAL = {
    str: _encode_str,
    float: es_number,
    int: int.__repr__,
    bool: lambda b: "true" if b else "false",
    type(None): lambda _: "null",
    dict: _canonical_dict,
    list: _canonical_list,
    tuple: _canonical_list,
}


_SCALARS = frozenset({str, int, float, bool, type(None)})
_NESTED = frozenset({dict, list}) | _SCALARS
# Where orjson's text can differ from RFC 8785's, for JSON values of the plain types: integral
# floats ("2.0" for "2", "1e+16" for "10000000000000000") and 1e-6 <= |x| < 1e-5 ("2e-6" for
# "0.000002"). Elsewhere both write the shortest round-trip digits the same way (tested).
_EXPONENT_SUSPECT = re.compile(rb"e\+(?:1[6-9]|20)(?![0-9])|e-6(?![0-9])")


_integral_float_in = re.compile(rb"\.0[,\]}]").search


def _exponent_suspect_in(out: bytes) -> bool:
    return (b"e-" in out or b"+" in out) and _EXPONENT_SUSPECT.search(out) is not None  # (the `in`s are fast)


def orjson_text_is_canonical(out: bytes) -> bool:
    """Whether orjson's text of plain JSON values is RFC 8785's as it stands: ASCII, with neither
    integral floats nor the exponents where the two differ (see fast_canonical)."""
    return out.isascii() and not _exponent_suspect_in(out) and not _integral_float_in(out)


def _plain(obj: dict | list) -> bool:
    """True if `obj` holds only dicts, lists and JSON scalars of exactly those types."""
    values = obj.values() if type(obj) is dict else obj
    types = set(map(type, values))
    if types <= _SCALARS:
        return True
    return types <= _NESTED and all(_plain(v) for v in values if type(v) is dict or type(v) is list)


def fast_canonical(obj: dict | list, parsed: bool = False, numeric: bool = False) -> bytes | None:
    """The canonical text (UTF-8) by orjson (~10x faster) when it is sure to be RFC 8785's, else None.

    ASCII-only output is required: key order by UTF-16 code units and string escapes then agree.
    `parsed`: `obj` came from a JSON parser, so it holds only the plain types (no need to look).
    `numeric`: no string in `obj` holds ".0" (an envelope of a kind in NUMERIC_KINDS), so integral
    floats can be found in the text ("2.0" → "2") without walking `obj` again.
    `parsed` and `numeric` also say that every float in `obj` is finite (parse_json refuses the
    others; a kind in NUMERIC_KINDS has only Finite floats): orjson writes NaN and Infinity as null.
    """
    try:
        if orjson is None or not (parsed or _plain(obj)):
            return None
        out = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError, RecursionError):  # an int beyond 64 bits, a non-str key, too deep
        return None
    if not (parsed or numeric) and b"null" in out and _non_finite_in(obj):
        return None  # the reference writer refuses it
    if not out.isascii() or _exponent_suspect_in(out):
        return None
    if _integral_float_in(out):  # "2.0" (or a string holding ".0,"): write integral floats as ints
        if numeric and b"-0.0" not in out:  # orjson's digits before ".0" are ECMAScript's below 1e16
            return out.replace(b".0,", b",").replace(b".0}", b"}").replace(b".0]", b"]")
        try:
            out = orjson.dumps(_integral_floats_as_ints(obj), option=orjson.OPT_SORT_KEYS)
        except _NotExact:
            return None
        if _integral_float_in(out):  # it was in a string after all, or -0.0
            return None
    return out


def _non_finite_in(obj: dict | list) -> bool:
    """Whether a NaN or an infinity is anywhere in `obj`."""
    for v in (obj.values() if type(obj) is dict else obj):
        t = type(v)
        if (t is float and not math.isfinite(v)) or ((t is dict or t is list) and _non_finite_in(v)):
            return True
    return False


_EXACT_INT_FLOAT = 2.0**53  # below it, int(x) has the digits ECMAScript writes for an integral x


class _NotExact(Exception):
    """An integral float too large for int(x) to have ECMAScript's digits."""


def _integral_floats_as_ints(obj: dict | list) -> dict | list:
    """A copy of `obj` with integral floats as ints (the same JSON number), or raise _NotExact."""
    out = obj.copy()
    for k, v in (obj.items() if type(obj) is dict else enumerate(obj)):
        t = type(v)
        if t is float:
            if v.is_integer():
                if abs(v) >= _EXACT_INT_FLOAT:
                    raise _NotExact
                out[k] = int(v)
        elif t is dict or t is list:
            out[k] = _integral_floats_as_ints(v)
    return out


def canonical_json(obj: Any) -> str:
    """RFC 8785 canonical text of a JSON value: sorted keys, no whitespace, ECMAScript numbers."""
    if type(obj) is dict or type(obj) is list:
        fast = fast_canonical(obj)
        if fast is not None:
            return fast.decode()
    write = _CANONICAL.get(type(obj))
    if write is None:
        raise InvalidEvent(f"not a JSON value: {type(obj).__name__}")
    return write(obj)



def envelope_text(env: dict, payload_text: str, with_hash: bool) -> str:
    """Canonical text of an envelope, given its payload's canonical text (keys in JCS order)."""
    step = env["step"]
    parts = [
        '{"attempt":', str(env["attempt"]),
        ',"event_id":', _encode_str(env["event_id"]),
    ]
    if with_hash:
        parts += [',"hash":', _encode_str(env["hash"])]
    parts += [
        ',"kind":', _encode_str(env["kind"]),
        ',"payload":', payload_text,
        ',"prev_hash":', _encode_str(env["prev_hash"]),
        ',"producer":', _encode_str(env["producer"]),
        ',"run_id":', _encode_str(env["run_id"]),
        ',"schema_version":', str(env["schema_version"]),
        ',"seq":', str(env["seq"]),
        ',"step":', "null" if step is None else str(step),
        ',"time":', _encode_str(env["time"]),
        "}",
    ]
    return "".join(parts)


def event_hash(env: dict, payload_text: str) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of the envelope without `hash`."""
    return hashlib.sha256(envelope_text(env, payload_text, with_hash=False).encode()).hexdigest()



def fast_canonical_texts(objs: list[dict], numeric: bool, parsed: bool = False) -> list[bytes] | None:
    """Each dict's canonical text, by one orjson call for all; None where that text might not be
    RFC 8785's (see fast_canonical) or cannot be cut apart (a "},{" in a nested dict or a string).
    `parsed`: the dicts came from a JSON parser, so they hold only the plain types (no need to look)."""
    if not parsed and not all(map(_plain, objs)):
        return None
    out = fast_canonical(objs, parsed=True, numeric=numeric)  # (types checked just above)
    if out is None or (not numeric and b"null" in out and _non_finite_in(objs)):  # (orjson's null for NaN)
        return None
    parts = out[1:-1].split(b"},{")
    if len(parts) != len(objs):
        return None
    if len(parts) == 1:
        return parts
    parts[0], parts[-1] = parts[0] + b"}", b"{" + parts[-1]
    return [parts[0], *(b"{%s}" % p for p in parts[1:-1]), parts[-1]]
