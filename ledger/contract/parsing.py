"""Reading JSON text strictly: what is not JSON an event may hold is refused with a one-line reason.

`parse_json` reads one message (orjson on the hot path, the standard library as the reference: exact
integers, no duplicate keys, no NaN/Infinity, no lone surrogates, no invalid UTF-8);
`parse_batch_entries` reads a batch message so that one bad entry costs only itself, whatever is
wrong with it (not UTF-8, cut short, not JSON): where the array as a whole cannot be read,
`split_batch` cuts it into its entries at the top level, and each is read alone.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from runledger.ledger.contract.canonical import orjson
from runledger.ledger.contract.events import InvalidEvent


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


class RefusedEntry(InvalidEvent):
    """A batch entry refused alone: the reason, and the entry's own bytes (for the quarantine) when
    the batch could be cut into entries (`raw`; None if not)."""

    def __init__(self, reason: str, raw: bytes | None = None) -> None:
        super().__init__(reason)
        self.raw = raw


def parse_batch_entries(data: bytes | str) -> list:
    """A batch message's entries, each as parse_json would read it alone: an entry it refuses (a
    duplicate key, a non-finite number, a lone surrogate, bytes not UTF-8, text cut short or not
    JSON) comes back as a RefusedEntry, its siblings as parsed, so one bad entry costs only itself.
    Raises InvalidEvent if the message is not a JSON array."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        top = _parse_json_stdlib(data, depth=ORJSON_MAX_DEPTH, lenient=True)
    except InvalidEvent:  # (not UTF-8, cut short, ...): each entry alone
        return [obj for _, obj in _read_entries(raw)]
    if type(top) is not list:
        raise InvalidEvent(f"a batch is a JSON array, got {type(top).__name__}")
    out: list = []
    pieces = None
    for i, entry in enumerate(top):
        reason = _refusal_in(entry)
        if reason is None:
            try:
                json.dumps(entry, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                reason = "a string holds a lone UTF-16 surrogate (unpaired \\ud800-\\udfff): not Unicode text"
            except (RecursionError, ValueError):
                reason = "not JSON this program reads: nested too deeply"
        if reason is not None and pieces is None:
            pieces = split_batch(raw)
            pieces = pieces if len(pieces) == len(top) else []
        out.append(entry if reason is None else RefusedEntry(reason, pieces[i] if pieces else None))
    return out


def _parse_entry(entry: bytes) -> Any:
    try:
        return parse_json(entry)
    except InvalidEvent as err:
        reason = str(err) if entry else "an empty entry (two commas in a row, or one before the ']')"
        return RefusedEntry(reason, entry)


# a JSON string (to its closing quote, or to the end of text cut short inside it), or a structural byte
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{},]', re.DOTALL)
_NEXT_ENTRY = re.compile(rb",\s*[\[{]")  # where an entry after a bad one may begin
RESYNC_TRIES = 256  # places tried, after an entry that cannot be read, for the next entry's beginning
RESYNC_TOKENS = 200_000  # tokens scanned looking for them, in all, per message (a hostile one costs ~0.1 s)


def _entry_end(data: bytes, pos: int, budget: list[int] | None = None) -> tuple[int, bytes]:
    """Where the top-level entry beginning at `pos` ends: (offset, b"," or b"]"), or (len, b"") at the end
    (or once `budget`, [tokens left], is spent: then as if at the end)."""
    depth = 0
    for m in _TOKENS.finditer(data, pos):
        if budget is not None:
            budget[0] -= 1
            if budget[0] < 0:
                return len(data), b""
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
        elif tok in (b"]", b"}"):
            if depth == 0:
                if tok == b"]":
                    return m.start(), tok
                continue  # a stray '}' at the top: part of its (bad) entry
            depth -= 1
        elif tok == b"," and depth == 0:
            return m.start(), tok
    return len(data), b""


def _read_entries(data: bytes) -> list[tuple[bytes, Any]]:
    """A batch's entries: (bytes, parsed or RefusedEntry). The entries are cut at the array's top-level
    commas by a tolerant scan that knows strings (and their escapes) and nesting, and nothing else:
    bytes that are not UTF-8 or not JSON stay inside their entry, and an entry cut short at the end is
    the last one. An entry that cannot be read may have swallowed its successors (cut short inside a
    string; not one that is whole JSON but for its bytes): the next entry is then looked for at the
    next ',{' or ',[' whose entry can be read.
    Bytes after the closing ']' are one more entry, refused. Raises InvalidEvent if not an array."""
    start = len(data) - len(data.lstrip())
    if data[start:start + 1] != b"[":
        raise InvalidEvent("a batch is a JSON array: it must begin with '['")
    out: list[tuple[bytes, Any]] = []
    pos = start + 1
    budget = [RESYNC_TOKENS]  # (and bytes parsed: twice the message)
    parse_left = 2 * len(data)
    scan = [2 * len(data) + 64]  # tokens the cutting may scan: entries after a resync are scanned again
    while True:
        end, stop = _entry_end(data, pos, scan)
        piece = data[pos:end].strip()
        if not out and stop == b"]" and not piece:  # "[]"
            break
        if scan[0] < 0:  # (many entries cut short, each swallowing the rest: no more cutting)
            out.append((piece, RefusedEntry("the rest of the batch: too many entries cut short to cut it further", piece)))
            break
        obj = _parse_entry(piece)
        if isinstance(obj, RefusedEntry) and not _whole(piece):
            for tries, m in enumerate(_NEXT_ENTRY.finditer(data, pos + 1)):
                if m.start() >= end and stop == b",":  # (the entry's own end: no successor swallowed)
                    break
                if tries == RESYNC_TRIES or budget[0] <= 0:
                    break
                after, _ = _entry_end(data, m.start() + 1, budget)
                parse_left -= after - m.start()
                if parse_left < 0 or budget[0] <= 0:
                    break
                if not isinstance(_parse_entry(data[m.start() + 1:after].strip()), RefusedEntry):
                    end, stop = m.start(), b","
                    piece = data[pos:end].strip()
                    obj = _parse_entry(piece)
                    break
        out.append((piece, obj))
        if stop != b",":
            break
        pos = end + 1
    if stop == b"]" and data[end + 1:].strip():
        rest = data[end + 1:].strip()
        out.append((rest, RefusedEntry("bytes after the batch's closing ']'", rest)))
    return out


def _whole(piece: bytes) -> bool:
    """Whether an entry refused is whole JSON but for its bytes (not UTF-8, NaN, ...): then it
    swallowed no successor."""
    try:
        json.loads(piece.decode("utf-8", "replace"))
        return True
    except (ValueError, RecursionError):
        return False


def split_batch(data: bytes) -> list[bytes]:
    """A batch's entries as bytes (see `_read_entries`). Raises InvalidEvent if `data` is not an array."""
    return [piece for piece, _ in _read_entries(data)]


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
