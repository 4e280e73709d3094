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
import time
from datetime import datetime
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

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
    return (b"e+" in out or b"e-" in out) and _EXPONENT_SUSPECT.search(out) is not None


def _plain(obj: dict | list) -> bool:
    """True if `obj` holds only dicts, lists and JSON scalars of exactly those types."""
    values = obj.values() if type(obj) is dict else obj
    types = set(map(type, values))
    if types <= _SCALARS:
        return True
    return types <= _NESTED and all(_plain(v) for v in values if type(v) is dict or type(v) is list)


def _canonical_fast(obj: dict | list, parsed: bool = False) -> bytes | None:
    """The canonical text (UTF-8) by orjson (~10x faster) when it is sure to be RFC 8785's, else None.

    ASCII-only output is required: key order by UTF-16 code units and string escapes then agree.
    `parsed`: `obj` came from a JSON parser, so it holds only the plain types (no need to look).
    """
    try:
        if orjson is None or not (parsed or _plain(obj)):
            return None
        out = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError, RecursionError):  # an int beyond 64 bits, a non-str key, too deep
        return None
    if not out.isascii() or _exponent_suspect_in(out):
        return None
    if _integral_float_in(out):  # "2.0" (or a string holding ".0,"): write integral floats as ints
        try:
            out = orjson.dumps(_integral_floats_as_ints(obj), option=orjson.OPT_SORT_KEYS)
        except _NotExact:
            return None
        if _integral_float_in(out):  # it was in a string after all, or -0.0
            return None
    return out


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
_PAYLOAD_VALIDATORS = {kind: model.__pydantic_validator__ for kind, model in KINDS.items()}
_ENVELOPE_VALIDATOR = Envelope.__pydantic_validator__
_PAYLOAD_LIST_VALIDATORS = {kind: TypeAdapter(list[model]) for kind, model in KINDS.items()}


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
    return payload_text


def parse_json(data: bytes | str) -> Any:
    """Parse JSON, refusing what is not JSON text (NaN/Infinity, lone surrogates, invalid UTF-8) with
    a clear reason. orjson parses the valid input (the ledger's hot path); anything it refuses is
    parsed again by the standard library, for the precise reason or, rarely, a different verdict."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return _parse_json_stdlib(data)


def _parse_json_stdlib(data: bytes | str) -> Any:

    def refuse(name: str) -> Any:
        raise InvalidEvent(f"{name} is not allowed in an event (send null, with skipped=true for a loss)")

    try:
        if isinstance(data, (bytes, bytearray)):
            text = data.decode()  # UTF-8 only (DESIGN.md), strictly: encoded surrogates are refused too
        else:
            text = data
            text.encode()  # a str from Python may hold lone surrogates
        obj = json.loads(text, parse_constant=refuse)
        if "\\u" in text:  # an escaped lone surrogate ("\\ud800") parses, but is not text: it cannot be hashed
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
    check_payload(kind, payload)
    env = {
        "event_id": make_event_id(run_id, producer, attempt, seq),
        "run_id": run_id,
        "producer": producer,
        "attempt": attempt,
        "seq": seq,
        "kind": kind,
        "time": time or utc_now(),
        "step": step,
        "schema_version": SCHEMA_VERSION,
        "prev_hash": prev_hash,
        "payload": payload,
    }
    body = _canonical_fast(env)  # the whole envelope at once, when orjson's text is the canonical one
    if body is None:
        payload_text = canonical_json(payload)
        env["hash"] = event_hash(env, payload_text)
        return env, envelope_text(env, payload_text, with_hash=True)
    env["hash"] = hashlib.sha256(body).hexdigest()
    text = body.decode()
    cut = text.index(',"kind":')  # "hash" sorts between "event_id" and "kind"; neither holds a quote
    return env, f'{text[:cut]},"hash":"{env["hash"]}"{text[cut:]}'


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
    if origin in (Union, getattr(__import__("types"), "UnionType")):
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
