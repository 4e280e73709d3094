"""Reading JSON text strictly: what is not JSON an event may hold is refused with a one-line reason.

`parse_json` reads one message (orjson on the hot path, the standard library as the reference: exact
integers, no duplicate keys, no NaN/Infinity, no lone surrogates, no invalid UTF-8);
`parse_batch_entries` reads a batch message so that one bad entry costs only itself.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from ledger.canonical import orjson
from ledger.events import InvalidEvent


def parse_json(data: bytes | str) -> Any:
    """Parse JSON, refusing what is not JSON text (NaN/Infinity, numbers past a double's range such
    as 1e400, duplicate keys in an object, lone surrogates, invalid UTF-8) with a clear reason.

    orjson parses the ledger's hot path, and its result is taken when orjson writes it back byte for
    byte as it came, as it does canonical JSON (but for numbers in 1e-6..1e-5 or from 1e21): text written
    from an object has no duplicate keys, and an integer orjson read as a float (one past 64 bits) is
    written back in another form. Anything else is parsed again by the standard library, the
    reference: integers exact, duplicate keys and non-finite numbers refused.
    """
    if orjson is not None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return _parse_json_stdlib(data)
        raw = data.encode() if isinstance(data, str) else data
        try:
            if orjson.dumps(obj) == raw:
                return obj
        except orjson.JSONEncodeError:  # nested deeper than orjson writes (254)
            pass
        return _parse_json_stdlib(data, depth=ORJSON_MAX_DEPTH)
    return _parse_json_stdlib(data)


ORJSON_MAX_DEPTH = 1024  # orjson reads JSON nested up to this deep; the reference must read it too


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        shown = repr(key) if len(key) <= 40 else repr(key[:40]) + "…"
        raise InvalidEvent(f"duplicate key {shown} in a JSON object (RFC 8785 input has none; parsers differ on which wins)")
    return obj


class _Refusal:
    """What the strict parse refuses, kept in place by the lenient one so that only its entry is refused."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _refusal_in(value: Any) -> str | None:
    stack = [value]
    while stack:  # (a loop, not recursion: entries may be nested 1,000 deep)
        v = stack.pop()
        if type(v) is _Refusal:
            return v.reason
        if type(v) is dict:
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)
    return None


def parse_batch_entries(data: bytes | str) -> list:
    """A batch message's entries, each as parse_json would read it alone: an entry it refuses (a
    duplicate key, a non-finite number, a lone surrogate) comes back as that InvalidEvent, its siblings
    as parsed, so one bad entry costs only itself. Raises InvalidEvent if the message is not a JSON array."""
    top = _parse_json_stdlib(data, depth=ORJSON_MAX_DEPTH, lenient=True)
    if type(top) is not list:
        raise InvalidEvent(f"a batch is a JSON array, got {type(top).__name__}")
    out: list = []
    for entry in top:
        reason = _refusal_in(entry)
        if reason is None:
            try:
                json.dumps(entry, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                reason = "a string holds a lone UTF-16 surrogate (unpaired \\ud800-\\udfff): not Unicode text"
            except (RecursionError, ValueError):
                reason = "not JSON this program reads: nested too deeply"
        out.append(entry if reason is None else InvalidEvent(reason))
    return out


def _parse_json_stdlib(data: bytes | str, depth: int = 0, lenient: bool = False) -> Any:
    """The reference parse (see parse_json); `depth`: read nesting this deep (orjson read it);
    `lenient`: what is refused becomes a _Refusal in place (see parse_batch_entries)."""

    def refuse(name: str) -> Any:
        reason = f"{name} is not allowed in an event (send null, with skipped=true for a loss)"
        if lenient:
            return _Refusal(reason)
        raise InvalidEvent(reason)

    def finite(text: str) -> float:
        x = float(text)
        if x in (math.inf, -math.inf):
            return refuse(f"{text[:30]} (beyond a double's range, read as Infinity)")
        return x

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
        try:
            return _unique_keys(pairs)
        except InvalidEvent as err:
            if lenient:
                return _Refusal(str(err))
            raise

    limit = sys.getrecursionlimit()
    try:
        if depth:  # the C parser counts its nesting against the interpreter's recursion limit
            sys.setrecursionlimit(limit + 2 * depth)
        if isinstance(data, (bytes, bytearray)):
            text = data.decode()  # UTF-8 only (DESIGN.md), strictly: encoded surrogates are refused too
        else:
            text = data
            text.encode()  # a str from Python may hold lone surrogates
        obj = json.loads(text, parse_constant=refuse, parse_float=finite, object_pairs_hook=unique_keys)
        if "\\u" in text and not lenient:  # an escaped lone surrogate ("\\ud800") parses, but is not text: it cannot be hashed
            json.dumps(obj, ensure_ascii=False).encode()
        return obj
    except InvalidEvent:
        raise
    except UnicodeEncodeError:
        raise InvalidEvent("a string holds a lone UTF-16 surrogate (unpaired \\ud800-\\udfff): not Unicode text") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidEvent(f"not JSON: {err}") from None
    except RecursionError:
        raise InvalidEvent("not JSON this program reads: nested too deeply") from None
    finally:
        if depth:
            sys.setrecursionlimit(limit)
