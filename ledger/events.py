"""The event contract, defined once: the envelope, every kind's payload, canonical JSON and the hash.

Everything else derives from this file: the Parquet columns (`arrow_schema`), the JSON Schema that
`runledger schema` prints, the ledger's validation and the SQL views. See DESIGN.md, "The contract".

An event is a fact in the past. A producer builds one with `seal(...)`; anyone checks one with
`check_envelope(obj)`, which returns the canonical payload text or raises `InvalidEvent` with a
one-line reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
import types
from datetime import datetime
from operator import itemgetter
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import NotRequired, Required, TypedDict

try:  # a faster parser for the ledger's hot path; the standard library's is the reference
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

SCHEMA_VERSION = 1
STREAM = "RUNLEDGER"
SUBJECT_PREFIX = "runledger"
MAX_EVENT_BYTES = 1 << 20  # one event's JSON text; larger input is quarantined, never truncated
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # run_id and producer: subject token, dir name
# [0-9], not \d: \d also matches non-ASCII digits (e.g. "٢٠٢٦"), which no timestamp parser reads
TIME_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$")
TIME_YEARS = (1970, 2261)  # stored as a timestamp via nanoseconds (int64 ns: 1677..2262)
HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class InvalidEvent(ValueError):
    """Input that is not a valid event; the message is the one-line reason."""


# --------------------------------------------------------------------------------------------
# Canonical JSON (RFC 8785 / JCS) and the hash
# --------------------------------------------------------------------------------------------

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


def _plain(obj: dict | list) -> bool:
    """True if `obj` holds only dicts, lists and JSON scalars of exactly those types."""
    values = obj.values() if type(obj) is dict else obj
    types = set(map(type, values))
    if types <= _SCALARS:
        return True
    return types <= _NESTED and all(_plain(v) for v in values if type(v) is dict or type(v) is list)


def _canonical_fast(obj: dict | list, parsed: bool = False, numeric: bool = False) -> bytes | None:
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
        fast = _canonical_fast(obj)
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


def make_event_id(run_id: str, producer: str, attempt: int, seq: int) -> str:
    return f"{run_id}:{producer}:{attempt}:{seq}"


def subject_for(run_id: str, kind: str) -> str:
    return f"{SUBJECT_PREFIX}.{run_id}.{kind}"


_second_text: list = [None, ""]  # (second, its formatted text): formatting dominates otherwise


def utc_now() -> str:
    """Now as RFC 3339 UTC with microseconds, e.g. 2026-11-29T10:00:00.123456Z."""
    t = time.time()
    sec = int(t)
    if _second_text[0] != sec:
        _second_text[:] = [sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))]
    return f"{_second_text[1]}.{int((t - sec) * 1e6):06d}Z"


def check_time(value: str) -> str:
    """An event time, or InvalidEvent: RFC 3339 UTC (TIME_RE), a real date and time, years TIME_YEARS."""
    if not isinstance(value, str) or not TIME_RE.fullmatch(value):
        raise InvalidEvent(f"time {value!r} is not RFC 3339 UTC like 2026-11-29T10:00:00.123456Z")
    if value[:19] == _valid_second[0]:
        return value
    try:
        year = datetime(int(value[0:4]), int(value[5:7]), int(value[8:10]),
                        int(value[11:13]), int(value[14:16]), int(value[17:19])).year
    except ValueError as err:
        raise InvalidEvent(f"time {value!r} is not a real date and time ({err})") from None
    if not TIME_YEARS[0] <= year <= TIME_YEARS[1]:
        raise InvalidEvent(f"time {value!r} is outside the years {TIME_YEARS[0]}..{TIME_YEARS[1]}")
    _valid_second[0] = value[:19]
    return value


_valid_second = [None]  # the last second checked valid: consecutive events mostly share it


def check_name(value: str, what: str) -> str:
    """A run_id or producer, or InvalidEvent saying why not (it is a subject token and a dir name)."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InvalidEvent(
            f"{what} {value!r} is not allowed: use 1-64 of a-z 0-9 _ - starting with a letter or digit "
            "(no dots, slashes or upper case: it is a NATS subject token and a directory name)"
        )
    return value


# --------------------------------------------------------------------------------------------
# Payloads: one frozen model per kind
# --------------------------------------------------------------------------------------------

Finite = Annotated[float, Field(allow_inf_nan=False)]
INT64_MAX = 2**63 - 1  # integers are stored in int64 Parquet columns
NonNeg = Annotated[int, Field(ge=0, le=INT64_MAX)]
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
Json = dict[str, Any]


class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class RunStarted(Payload):
    """A worker started (or resumed, or forked) a run: everything needed to audit it later."""

    config: Json
    config_hash: str
    code_commit: str | None = None
    preset: str | None = None
    token_budget: NonNeg
    tokens_per_step: NonNeg | None = None
    schedule: Json = Field(description="peak_lr, warmup_steps, horizon_tokens, min_lr_ratio, ...")
    data_mixture: dict[str, Finite] = Field(default_factory=dict)
    planned_tokens_per_s: Finite | None = None
    deadline_s: Finite | None = None
    hardware: Json = Field(default_factory=dict)
    peak_flops: Finite | None = None
    flops_per_token: Finite | None = None
    thresholds: dict[str, Finite] = Field(default_factory=dict, description="overrides of the anchors")
    resumed_from: Json | None = Field(None, description="checkpoint path, step, content_hash")
    parent: Json | None = Field(None, description="fork: run_id, step, checkpoint content_hash")
    ladder: Json | None = Field(None, description="ladder name, rung, target")


class StepCompleted(Payload):
    """One optimizer step."""

    loss: Finite | None
    grad_norm: Finite | None
    lr: Finite
    tokens: NonNeg
    step_time_s: Finite
    param_norm: Finite | None = None
    z_loss: Finite | None = None
    lb_loss: Finite | None = None
    router_entropy: Finite | None = None
    mfu: Finite | None = None
    tokens_per_s: Finite | None = None
    seq_len: NonNeg | None = None
    flops_per_token: Finite | None = Field(None, description="training FLOPs per token at this step's seq_len (mfu's numerator)")
    skipped: bool = False


class LayerDrops(Payload):
    layer: NonNeg
    assignments: NonNeg
    sender_dropped: NonNeg
    receiver_dropped: NonNeg
    drop_fraction: Finite
    expert_loads: list[NonNeg] = Field(default_factory=list)


class TokensDropped(Payload):
    """Token assignments the capacity-limited transport dropped in one step, per layer."""

    dispatch: Literal["capacity", "dropless"]
    assignments: NonNeg
    dropped: NonNeg
    drop_fraction: Finite
    layers: list[LayerDrops] = Field(default_factory=list)
    cf_send: Finite | None = None
    cf_recv: Finite | None = None
    seq_len: NonNeg | None = None
    probe: bool = Field(False, description="measured at a longer length than trained (before a context extension)")


class EvalCompleted(Payload):
    """Held-out loss, overall and per domain."""

    loss: Finite
    domain_losses: dict[str, Finite] = Field(default_factory=dict)
    tokens: NonNeg = 0
    split: str = "heldout"


class CheckpointSaved(Payload):
    path: str
    bytes: NonNeg
    seconds: Finite
    content_hash: str
    config_hash: str | None = None
    tokens_seen: NonNeg | None = None
    reason: Literal["periodic", "requested", "final", "rollback"] = "periodic"


class DataSource(Payload):
    domain: str
    path: str
    sha256: str
    byte_start: NonNeg
    byte_end: NonNeg


class DataRecorded(Payload):
    """Where the tokens came from: sources with hashes, byte ranges, tokens per domain."""

    sources: list[DataSource] = Field(default_factory=list)
    tokens_per_domain: dict[str, NonNeg] = Field(default_factory=dict)
    mixture: dict[str, Finite] = Field(default_factory=dict)
    seed: Int64 | None = None


class ForecastMade(Payload):
    """The ladder's projected loss for the target run at one fraction of training."""

    target_run: str
    fraction: Finite
    target_tokens: NonNeg | None = None
    target_flops: Finite | None = None
    projected_loss: Finite
    band_low: Finite
    band_high: Finite
    fit: dict[str, Finite] = Field(default_factory=dict, description="E, A, alpha")
    rungs: list[str] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    self_check_error: Finite | None = None


class AlertRaised(Payload):
    alert_id: str
    agent: str
    rule: str
    severity: Literal["info", "warn", "fail"] = "warn"
    state: Literal["open", "resolved"] = "open"
    message: str
    evidence: Json = Field(default_factory=dict)


ACTIONS = (
    "set_token_horizon", "set_capacity_factor", "set_dispatch", "hold_context_extension",
    "release_context_extension", "set_z_loss_weight", "checkpoint_now", "rollback",
    "approve", "reject",
)


class DecisionMade(Payload):
    """A contingency decision (an agent's or a person's) with the evidence that caused it."""

    decision_id: str
    agent: str
    rule: str
    action: Literal[ACTIONS]  # type: ignore[valid-type]
    params: Json = Field(default_factory=dict)
    rationale: str
    evidence: Json = Field(default_factory=dict, description="query, rows, ledger position seen")
    mode: Literal["auto", "proposed"] = "auto"


class DecisionApplied(Payload):
    """The worker carried out (or refused) a decision at a step boundary."""

    decision_id: str
    action: str
    status: Literal["applied", "refused"] = "applied"
    before: Json = Field(default_factory=dict)
    after: Json = Field(default_factory=dict)
    reason: str | None = None


class RunFinished(Payload):
    status: Literal["completed", "failed", "stopped"]
    final_step: NonNeg | None = None
    tokens_seen: NonNeg | None = None
    final_loss: Finite | None = None
    reason: str | None = None


KINDS: dict[str, type[Payload]] = {
    "run_started": RunStarted,
    "step": StepCompleted,
    "drops": TokensDropped,
    "eval": EvalCompleted,
    "checkpoint": CheckpointSaved,
    "data": DataRecorded,
    "forecast": ForecastMade,
    "alert": AlertRaised,
    "decision": DecisionMade,
    "decision_applied": DecisionApplied,
    "run_finished": RunFinished,
}


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
# integral floats (`_canonical_fast`).
NUMERIC_KINDS = frozenset(kind for kind, model in KINDS.items()
                          if not any(_free_text_in(f.annotation) for f in model.model_fields.values()))


class Envelope(BaseModel):
    """One event: who, when, where in its producer's chain, and the kind-specific payload."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    event_id: str
    run_id: Annotated[str, Field(pattern=NAME_RE.pattern)]
    producer: Annotated[str, Field(pattern=NAME_RE.pattern)]
    attempt: NonNeg
    seq: NonNeg
    kind: Literal[tuple(KINDS)]  # type: ignore[valid-type]
    time: Annotated[str, Field(pattern=TIME_RE.pattern)]
    step: NonNeg | None
    schema_version: Literal[SCHEMA_VERSION]
    prev_hash: str
    hash: Annotated[str, Field(pattern=HASH_RE.pattern)]
    payload: Json


ENVELOPE_FIELDS = tuple(Envelope.model_fields)
_ENVELOPE_VALIDATOR = Envelope.__pydantic_validator__


def _as_typeddict(model: type[Payload]) -> type:
    """The same rules as `model`, as a TypedDict: pydantic checks a list of plain dicts against it
    ~2.5x faster than against the model, as it builds no model objects. Only for models whose rules
    are all in their fields' annotations (no validator methods); tests/test_events.py compares the two."""
    decorators = model.__pydantic_decorators__
    assert not (decorators.field_validators or decorators.model_validators), f"{model.__name__} has validators"
    fields = {}
    for name, f in model.model_fields.items():
        annotation = f.rebuild_annotation()  # with its constraints (ge, allow_inf_nan, ...)
        fields[name] = Required[annotation] if f.is_required() else NotRequired[annotation]
    td = TypedDict(model.__name__, fields)  # type: ignore[operator]
    return with_config(ConfigDict(extra="forbid", strict=True))(td)


_PAYLOAD_TYPEDDICTS = {kind: _as_typeddict(model) for kind, model in KINDS.items()}
_PAYLOAD_VALIDATORS = {kind: TypeAdapter(td) for kind, td in _PAYLOAD_TYPEDDICTS.items()}
_PAYLOAD_LIST_VALIDATORS = {kind: TypeAdapter(list[td]) for kind, td in _PAYLOAD_TYPEDDICTS.items()}


def payloads_valid(kind: str, payloads: list) -> bool:
    """True if every payload is valid for `kind` (one call for a batch; check_payload says why not)."""
    validator = _PAYLOAD_LIST_VALIDATORS.get(kind)
    if validator is None:
        return False
    try:
        validator.validate_python(payloads)
        return True
    except ValidationError:
        return False


def _one_line(err: ValidationError, prefix: str = "") -> str:
    parts = []
    for e in err.errors()[:3]:
        # a key may be any string ("\n", ""): quote the odd ones so that the reason stays one readable line
        loc = ".".join(str(p) if isinstance(p, int) or (p.isprintable() and p) else repr(p) for p in e["loc"]) or "(root)"
        parts.append(f"{prefix}{loc}: {e['msg']}")
    more = err.error_count() - 3
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def check_payload(kind: str, payload: Any) -> None:
    """Raise InvalidEvent unless `payload` is valid for `kind`."""
    validator = _PAYLOAD_VALIDATORS.get(kind)
    if validator is None:
        raise InvalidEvent(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    try:
        validator.validate_python(payload)
    except ValidationError as err:
        raise InvalidEvent(_one_line(err, "payload.")) from None


def _float_fields(model: type[Payload]) -> list[tuple[str, bool]]:
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


_EXACT_DOUBLE_INT = 2**53  # up to it every integer is a double; past it, only some are
LONG_DIGITS = re.compile(r"\d{16}")  # an integer literal this long may be past 2**53
LONG_DIGITS_B = re.compile(rb"\d{16}")


def _as_double(v: int) -> float | None:
    """The double that JCS writes as these digits (2.0**60 is written 1152921504606847000), or None."""
    try:
        x = float(v)
    except OverflowError:
        return None
    return x if canonical_json(x) == str(v) else None


def check_exact_floats(kind: str, payload: dict, fix: bool = False) -> None:
    """Raise InvalidEvent if a float field holds an integer that no double equals (2**53 + 1, say): its
    float column could not store it (such a loss once crash-looped the ledger). With `fix`, an integer
    past 2**53 that is a double's canonical text (JCS writes 2.0**60 as 1152921504606847000) is made that float in
    `payload`, so the column takes it (the ledger's parsed copy; its text is unchanged). Callers ask only
    when the payload's text has a 16-digit run (LONG_DIGITS), so the hot path pays one regex search."""
    for name, is_dict in _FLOAT_FIELDS.get(kind, ()):
        value = payload.get(name) if isinstance(payload, dict) else None
        holder = value if is_dict and isinstance(value, dict) else {name: value} if not is_dict else {}
        for key, v in holder.items():
            if type(v) is not int or -_EXACT_DOUBLE_INT <= v <= _EXACT_DOUBLE_INT:
                continue
            x = _as_double(v)
            if x is None:
                where = f"payload.{name}" + (f".{key}" if is_dict else "")
                raise InvalidEvent(f"{where}: the integer {v} has no exact float64 value; send it as a float")
            if fix:
                (value if is_dict else payload)[key] = x


_ENVELOPE_KEYS = frozenset(ENVELOPE_FIELDS)


_NAMES_OK: set[tuple[str, str]] = set()  # (run_id, producer) pairs seen valid: a ledger sees few


def _names_ok(run_id: Any, producer: Any) -> bool:
    if type(run_id) is not str or type(producer) is not str:
        return False
    if (run_id, producer) in _NAMES_OK:
        return True
    ok = NAME_RE.fullmatch(run_id) is not None and NAME_RE.fullmatch(producer) is not None
    if ok and len(_NAMES_OK) < 65536:
        _NAMES_OK.add((run_id, producer))
    return ok


def _envelope_fields_ok(o: dict) -> bool:
    """The envelope model's rules, checked directly (the hot path of the ledger); False if any fails."""
    step = o.get("step", -1)
    return (
        o.keys() == _ENVELOPE_KEYS
        and type(o["event_id"]) is str
        and _names_ok(o["run_id"], o["producer"])
        and type(o["attempt"]) is int and 0 <= o["attempt"] <= INT64_MAX
        and type(o["seq"]) is int and 0 <= o["seq"] <= INT64_MAX
        and type(o["kind"]) is str and o["kind"] in KINDS
        and type(o["time"]) is str  # its format: check_time
        and (step is None or (type(step) is int and 0 <= step <= INT64_MAX))
        and o["schema_version"] == SCHEMA_VERSION and type(o["schema_version"]) is int
        and type(o["prev_hash"]) is str
        and type(o["hash"]) is str and HASH_RE.fullmatch(o["hash"]) is not None
        and type(o["payload"]) is dict
    )


def _explain_envelope(obj: dict) -> None:
    """Raise InvalidEvent saying why the envelope is invalid, most useful reason first."""
    for name in ("run_id", "producer"):
        if name in obj:
            check_name(obj[name], name)
    if "kind" in obj and not (isinstance(obj["kind"], str) and obj["kind"] in KINDS):  # [] is unhashable
        raise InvalidEvent(f"unknown kind {obj['kind']!r} (kinds: {', '.join(KINDS)})")
    try:
        _ENVELOPE_VALIDATOR.validate_python(obj)
    except ValidationError as err:
        raise InvalidEvent(_one_line(err)) from None
    raise InvalidEvent("invalid envelope")  # the direct check and the model disagree: still refuse


def check_envelope(obj: Any, parsed: bool = False, payload_checked: bool = False) -> str:
    """Validate an envelope completely; return its payload's canonical text.

    Checks the envelope fields, the payload against its kind's model, the event_id rule, the
    prev_hash rule for seq 0, and the hash. Raises InvalidEvent with a one-line reason.
    `parsed`: `obj` is what `parse_json` returned (so it holds only JSON's types).
    `payload_checked`: the caller has validated the payload against its kind's model already.
    """
    if not isinstance(obj, dict):
        raise InvalidEvent(f"an event is a JSON object, got {type(obj).__name__}")
    if not _envelope_fields_ok(obj):
        _explain_envelope(obj)
    expected_id = make_event_id(obj["run_id"], obj["producer"], obj["attempt"], obj["seq"])
    if obj["event_id"] != expected_id:
        raise InvalidEvent(f"event_id {obj['event_id']!r} breaks the rule run_id:producer:attempt:seq ({expected_id!r})")
    if obj["seq"] == 0 and obj["prev_hash"] != "":
        raise InvalidEvent("prev_hash must be empty for seq 0")
    if obj["seq"] > 0 and not HASH_RE.fullmatch(obj["prev_hash"]):
        raise InvalidEvent("prev_hash must be the 64-hex hash of the previous event for seq > 0")
    check_time(obj["time"])
    if not payload_checked:
        check_payload(obj["kind"], obj["payload"])
    unhashed = obj.copy()
    del unhashed["hash"]
    body = _canonical_fast(unhashed, parsed)
    if body is not None:  # the common case: orjson wrote the canonical text of the whole envelope
        computed = hashlib.sha256(body).hexdigest()
        # the payload's text, from the body: the fields before it ("attempt", "event_id", "kind") and
        # after it ("prev_hash", ... "time") were checked above and cannot hold these key texts
        payload_text = body[body.index(b'"payload":') + 10:body.rindex(b',"prev_hash":"')].decode()
    else:
        try:
            payload_text = canonical_json(obj["payload"])
        except RecursionError:
            raise InvalidEvent("payload is nested too deeply") from None
        computed = event_hash(obj, payload_text)
    if computed != obj["hash"]:
        raise InvalidEvent(f"hash mismatch: the envelope says {obj['hash'][:12]}…, its content hashes to {computed[:12]}…")
    if LONG_DIGITS.search(payload_text):
        check_exact_floats(obj["kind"], obj["payload"], fix=parsed)
    return payload_text


_COLUMN_OF = {name: itemgetter(name) for name in ENVELOPE_FIELDS}
_HASH_FIELD = len(',"hash":"') + 64 + 1  # the bytes of the hash field in an envelope's text


def check_batch(data: bytes, envs: Any, run_id: str, kind: str) -> list[str] | None:
    """The payload texts of a batch message (`data`, parsed: `envs`) whose envelopes are all valid,
    checked a column at a time; None when the batch is not in the plain form checked here (then
    check_envelope checks each envelope alone, and says why one is invalid).

    The plain form: what `Emitter` sends, 2 or more events of one chain, seqs consecutive, each
    linked to the one before (prev_hash), and `data` byte for byte the canonical text of `envs`, so
    that each event's canonical text (to hash) and payload text are slices of `data`. It accepts an
    event only where check_envelope accepts it: tests/test_ledger_batch.py compares the two.
    """
    if type(envs) is not list or (n := len(envs)) < 2 or set(map(type, envs)) != {dict} \
            or set(map(len, envs)) != {len(ENVELOPE_FIELDS)}:
        return None
    try:  # every key present (and, with the lengths above, no other)
        col = {name: list(map(get, envs)) for name, get in _COLUMN_OF.items()}
    except KeyError:
        return None
    first = envs[0]
    producer, attempt, seq0 = first["producer"], first["attempt"], first["seq"]
    seqs = col["seq"]
    if not (
        _names_ok(run_id, producer) and kind in KINDS
        and col["run_id"].count(run_id) == n and col["producer"].count(producer) == n
        and col["kind"].count(kind) == n
        and set(map(type, col["attempt"])) == {int} and col["attempt"].count(attempt) == n
        and 0 <= attempt <= INT64_MAX
        and set(map(type, col["schema_version"])) == {int} and col["schema_version"].count(SCHEMA_VERSION) == n
        and set(map(type, seqs)) == {int} and seq0 >= 0 and seq0 + n - 1 <= INT64_MAX
        and seqs == list(range(seq0, seq0 + n))
        and col["event_id"] == [f"{run_id}:{producer}:{attempt}:{s}" for s in seqs]
        and set(map(type, col["payload"])) == {dict}
        and set(map(type, col["time"])) == {str} and all(map(TIME_RE.fullmatch, col["time"]))
        and set(map(type, col["prev_hash"])) == {str} and set(map(type, col["hash"])) == {str}
        and (first["prev_hash"] == "" if seq0 == 0 else HASH_RE.fullmatch(first["prev_hash"]) is not None)
        and col["prev_hash"][1:] == col["hash"][:-1]
    ):
        return None
    if not _steps_ok(col["step"]):
        return None
    try:
        for second in {t[:19] for t in col["time"]}:
            check_time(second + "Z")
    except InvalidEvent:
        return None
    # canonical text: orjson's is RFC 8785's where it is ASCII and holds neither integral floats nor
    # the exponents where the two differ (see _canonical_fast)
    if not data.isascii() or _exponent_suspect_in(data) or _integral_float_in(data) or orjson is None:
        return None
    try:
        if orjson.dumps(envs, option=orjson.OPT_SORT_KEYS) != data:
            return None
    except (TypeError, orjson.JSONEncodeError):  # nested deeper than orjson writes (254), say
        return None
    parts = data[1:-1].split(b'},{"attempt":')  # each event's text, less what the split took
    if len(parts) != n:  # the separator also occurs inside a string
        return None
    parts[0], parts[-1] = parts[0][len(b'{"attempt":'):], parts[-1][:-1]
    digests, texts = [], []
    for part in parts:  # `"attempt":N,"event_id":"..."` come first and hold no quote: the first
        cut = part.index(b',"hash":"')  # `,"hash":"` is the hash field, and the first `,"payload":`...
        digests.append(hashlib.sha256(b'{"attempt":' + part[:cut] + part[cut + _HASH_FIELD:] + b"}").hexdigest())
        # ...and the last `,"prev_hash":"` the fields after the payload (64-hex, names, numbers)
        texts.append(part[part.index(b',"payload":', cut) + 11:part.rindex(b',"prev_hash":"')].decode())
    if digests != col["hash"] or not payloads_valid(kind, col["payload"]) or LONG_DIGITS_B.search(data):
        return None  # (a long integer: check_envelope checks it has a float64, when it is in a float field)
    return texts


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


def _steps_ok(steps: list) -> bool:
    """Whether every step is None or an int in 0..INT64_MAX (check_position's rule, for many at once)."""
    numbered = [s for s in steps if s is not None]
    return not numbered or (set(map(type, numbered)) == {int} and min(numbered) >= 0 and max(numbered) <= INT64_MAX)


def check_position(attempt: Any, seq: Any, step: Any) -> None:
    """Raise InvalidEvent unless attempt and seq are ints in 0..INT64_MAX and step is one or None."""
    for name, value in (("attempt", attempt), ("seq", seq), ("step", step)):
        if not (type(value) is int and 0 <= value <= INT64_MAX) and not (name == "step" and value is None):
            allowed = f"an integer in 0..{INT64_MAX}" + (" or None" if name == "step" else "")
            raise InvalidEvent(f"{name} {value!r} is not {allowed}")


def seal(
    run_id: str, producer: str, attempt: int, seq: int, kind: str, payload: dict,
    step: int | None, prev_hash: str, time: str | None = None,
) -> tuple[dict, str]:
    """Build a valid, hashed envelope; return (envelope, its canonical wire text).

    Raises InvalidEvent for a bad name or payload, so a producer learns at `emit` time.
    """
    if not _names_ok(run_id, producer):
        check_name(run_id, "run_id")
        check_name(producer, "producer")
    if time is not None:
        check_time(time)
    check_position(attempt, seq, step)
    check_payload(kind, payload)
    time = time or utc_now()
    env = {
        "event_id": make_event_id(run_id, producer, attempt, seq),
        "run_id": run_id,
        "producer": producer,
        "attempt": attempt,
        "seq": seq,
        "kind": kind,
        "time": time,
        "step": step,
        "schema_version": SCHEMA_VERSION,
        "prev_hash": prev_hash,
        "payload": payload,
    }
    payload_text = _canonical_fast(payload, numeric=kind in NUMERIC_KINDS)
    if LONG_DIGITS_B.search(payload_text) if payload_text is not None else True:
        check_exact_floats(kind, payload)
    if payload_text is None:  # the reference writer
        payload_text = canonical_json(payload)
        env["hash"] = event_hash(env, payload_text)
        return env, envelope_text(env, payload_text, with_hash=True)
    [env["hash"]], [text] = _envelope_texts(run_id, producer, attempt, seq, kind, time, [step], [payload_text], prev_hash)
    return env, text.decode()


def seal_many(
    run_id: str, producer: str, attempt: int, seq: int, kind: str, payloads: list[dict],
    steps: list[int | None] | None, prev_hash: str, time: str | None = None,
) -> tuple[list[str], list[str], list[bytes]]:
    """Seal consecutive events of one kind at once: (event_ids, hashes, canonical wire texts as
    UTF-8), the same as `seal` called for each in turn (tests/test_events.py compares them), at a
    third of the CPU: the payloads are validated in one call and written by orjson in one, and each
    envelope's text is put together around its payload's. The events share one `time`.
    Raises InvalidEvent (naming the event) and seals none if one is bad.
    """
    n = len(payloads)
    steps = [None] * n if steps is None else list(steps)
    if len(steps) != n:
        raise ValueError(f"{n} payloads but {len(steps)} steps")
    if not _names_ok(run_id, producer):
        check_name(run_id, "run_id")
        check_name(producer, "producer")
    time = utc_now() if time is None else check_time(time)
    if not n:
        return [], [], []
    check_position(attempt, seq, None)
    check_position(attempt, seq + n - 1, None)
    if not _steps_ok(steps):
        for step in steps:
            check_position(attempt, seq, step)  # raises at the first bad one
    if kind not in KINDS:
        raise InvalidEvent(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    if not payloads_valid(kind, payloads):
        for i, payload in enumerate(payloads):
            try:
                check_payload(kind, payload)
            except InvalidEvent as err:
                raise InvalidEvent(f"event {i} of {n}: {err}") from None
    ids = [f"{run_id}:{producer}:{attempt}:{s}" for s in range(seq, seq + n)]
    payload_texts = _canonical_texts(payloads, kind in NUMERIC_KINDS)
    if payload_texts is None:  # not in the form written at once here: one at a time
        hashes, texts = [], []
        for i, (s, step, payload) in enumerate(zip(range(seq, seq + n), steps, payloads)):
            try:
                env, text = seal(run_id, producer, attempt, s, kind, payload, step, prev_hash, time)
            except InvalidEvent as err:
                raise InvalidEvent(f"event {i} of {n}: {err}") from None
            hashes.append(prev_hash := env["hash"])
            texts.append(text.encode())
        return ids, hashes, texts
    for i, text in enumerate(payload_texts):
        if LONG_DIGITS_B.search(text):
            try:
                check_exact_floats(kind, payloads[i])
            except InvalidEvent as err:
                raise InvalidEvent(f"event {i} of {n}: {err}") from None
    return (ids, *_envelope_texts(run_id, producer, attempt, seq, kind, time, steps, payload_texts, prev_hash))


def _envelope_texts(
    run_id: str, producer: str, attempt: int, seq: int, kind: str, time: str, steps: list[int | None],
    payload_texts: list[bytes], prev_hash: str,
) -> tuple[list[str], list[bytes]]:
    """(hashes, canonical texts) of consecutive envelopes, put together around their payloads' texts.
    The keys are in canonical order; the strings (names, kind, time, ids, hex) are checked already
    to need no escaping and hold no "%"; the ints (attempt, seq, steps) are ints, not bools."""
    rest = (f',"kind":"{kind}","payload":%s,"prev_hash":"%s","producer":"{producer}","run_id":"{run_id}",'
            f'"schema_version":{SCHEMA_VERSION},"seq":%d,"step":%s,"time":"{time}"}}').encode()
    head = f'{{"attempt":{attempt},"event_id":"{run_id}:{producer}:{attempt}:'.encode()
    sha256 = hashlib.sha256
    prev = prev_hash.encode()
    hashes, texts = [], []
    for s, step, payload_text in zip(range(seq, seq + len(steps)), steps, payload_texts):
        start = b'%s%d"' % (head, s)
        tail = rest % (payload_text, prev, s, b"null" if step is None else b"%d" % step)
        digest = sha256(start + tail).hexdigest()
        hashes.append(digest)
        prev = digest.encode()
        texts.append(b'%s,"hash":"%s"%s' % (start, prev, tail))
    return hashes, texts


def _canonical_texts(objs: list[dict], numeric: bool) -> list[bytes] | None:
    """Each dict's canonical text, by one orjson call for all; None where that text might not be
    RFC 8785's (see _canonical_fast) or cannot be cut apart (a "},{" in a nested dict or a string)."""
    if not all(map(_plain, objs)):
        return None
    out = _canonical_fast(objs, parsed=True, numeric=numeric)  # (types checked just above)
    if out is None or (not numeric and b"null" in out and _non_finite_in(objs)):  # (orjson's null for NaN)
        return None
    parts = out[1:-1].split(b"},{")
    if len(parts) != len(objs):
        return None
    if len(parts) == 1:
        return parts
    parts[0], parts[-1] = parts[0] + b"}", b"{" + parts[-1]
    return [parts[0], *(b"{%s}" % p for p in parts[1:-1]), parts[-1]]


def json_schema() -> dict:
    """JSON Schema of the envelope and of every kind's payload (what `runledger schema` prints)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "envelope": Envelope.model_json_schema(),
        "kinds": {kind: model.model_json_schema() for kind, model in KINDS.items()},
    }


# --------------------------------------------------------------------------------------------
# Column types for storage (derived from the models above)
# --------------------------------------------------------------------------------------------


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


def payload_columns(kind: str) -> dict[str, str]:
    """Typed payload columns of a kind: field name -> column kind (see `column_kind`)."""
    return {name: column_kind(f.annotation) for name, f in KINDS[kind].model_fields.items()}


def _check_no_collisions() -> None:
    reserved = set(ENVELOPE_FIELDS) | {"stream_seq", "ingested_at", "ts"}
    for kind, model in KINDS.items():
        clash = reserved & set(model.model_fields)
        assert not clash, f"payload of {kind} reuses envelope column names {clash}"


_check_no_collisions()
_FLOAT_FIELDS = {kind: _float_fields(model) for kind, model in KINDS.items()}  # (after column_kind)
