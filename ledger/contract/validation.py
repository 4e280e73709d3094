"""Checking events against the contract: names, times, positions, payloads and whole envelopes.

`check_envelope(obj)` validates a received envelope completely and returns its payload's canonical
text, or raises InvalidEvent with a one-line reason. Payloads are checked against TypedDict copies of
the models in `runledger.ledger.contract.events` (`payloads_valid` checks a list of them in one call: the ledger's batch
path); `check_exact_floats` refuses an integer a float column could not store.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import NotRequired, Required, TypedDict

from runledger.ledger.contract.canonical import canonical_json, event_hash, fast_canonical
from runledger.ledger.contract.columns import FLOAT_FIELDS
from runledger.ledger.contract.roles import ACK_PRODUCERS, PERSON_PREFIX, is_agent_or_person, is_person, may_acknowledge
from runledger.ledger.contract.events import (ENVELOPE_FIELDS, HASH_RE, INT64_MAX, KINDS, NAME_RE, REGISTRY, SCHEMA_VERSION, TIME_RE, TIME_YEARS, Envelope, InvalidEvent, Payload, make_event_id)

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


_ENVELOPE_VALIDATOR = Envelope.__pydantic_validator__


def _as_typeddict(model: type[Payload]) -> type:
    """The same rules as `model`, as a TypedDict: pydantic checks a list of plain dicts against it
    ~2.5x faster than against the model, as it builds no model objects. Only for models whose rules
    are in their fields' annotations and in "before" model validators (which see the dict as given:
    DecisionMade's params for its action); tests/unit/test_events.py compares the two."""
    decorators = model.__pydantic_decorators__
    befores = [d.func for d in decorators.model_validators.values() if d.info.mode == "before"]
    assert not decorators.field_validators and len(befores) == len(decorators.model_validators), \
        f"{model.__name__} has validators a TypedDict cannot carry"
    fields = {}
    for name, f in model.model_fields.items():
        annotation = f.rebuild_annotation()  # with its constraints (ge, allow_inf_nan, ...)
        fields[name] = Required[annotation] if f.is_required() else NotRequired[annotation]
    td = with_config(ConfigDict(extra="forbid", strict=True))(TypedDict(model.__name__, fields))  # type: ignore[operator]
    for check in befores:
        td = Annotated[td, BeforeValidator(lambda data, check=check: check(data))]
    return td


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
        if not e["loc"] and e["type"] == "value_error":  # a model validator's reason names its field itself
            parts.append(f"{prefix}{e['ctx']['error']}")
            continue
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




WORKER_ONLY_KINDS = frozenset(kind for kind, k in REGISTRY.items() if k.publishers == ("worker",))


def speaker_problem(kind: str, producer: str, payloads: list) -> str | None:
    """Why events of (`kind`, `producer`) claim to speak for someone their producer is not (runledger.ledger.contract.roles);
    None if they do not. An alert's `agent` is its producer (a person's producer may name the person,
    `person:NAME`), so a route or a reader that trusts the one trusts the other; and a kind only a
    worker may publish (WORKER_ONLY_KINDS) never carries an agent's or a person's producer name, as
    on a secure server only a worker could have sent it."""
    if kind == "alert":
        for p in payloads:
            agent = p.get("agent") if isinstance(p, dict) else None
            if agent != producer and not (is_person(producer) and isinstance(agent, str) and agent.startswith(PERSON_PREFIX)):
                return f"an alert speaks for its producer: payload.agent {agent!r} is not the producer {producer!r}"
    elif kind == "alert_ack" and not may_acknowledge(producer):
        return f"an alert_ack is a person's or notify's (producer {', '.join(ACK_PRODUCERS)}), not producer {producer!r}'s"
    elif kind == "tombstone" and not is_person(producer):
        return f"a tombstone is a person's (`runledger delete`, producer 'cli'), not producer {producer!r}'s"
    elif kind in WORKER_ONLY_KINDS and is_agent_or_person(producer):
        return f"producer {producer!r} is an agent's or a person's name, and a {kind!r} event is a worker's"
    return None


_EXACT_DOUBLE_INT = 2**53  # up to it every integer is a double; past it, only some are


def long_int_in(kind: str, payload: dict) -> bool:
    """Whether a float field of `payload` holds an integer past 2**53 (which `check_exact_floats` must
    see): a look at the float fields' values, about 0.5 us for a step (a regex over the text cost more,
    and the 17 digits of an ordinary float or a run in a hash would match it)."""
    for name, is_dict in FLOAT_FIELDS.get(kind, ()):
        v = payload.get(name)
        if type(v) is int:
            if v > _EXACT_DOUBLE_INT or v < -_EXACT_DOUBLE_INT:
                return True
        elif is_dict and type(v) is dict:
            for x in v.values():
                if type(x) is int and (x > _EXACT_DOUBLE_INT or x < -_EXACT_DOUBLE_INT):
                    return True
    return False


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
    when `long_int_in` finds such an integer, so the hot path pays a look at the float fields."""
    for name, is_dict in FLOAT_FIELDS.get(kind, ()):
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


def names_ok(run_id: Any, producer: Any) -> bool:
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
        and names_ok(o["run_id"], o["producer"])
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

    Checks the envelope fields, the payload against its kind's model, who it speaks for
    (`speaker_problem`), the event_id rule, the prev_hash rule for seq 0, and the hash. Raises
    InvalidEvent with a one-line reason.
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
    if (obj["kind"] in ("alert", "alert_ack", "tombstone") or obj["kind"] in WORKER_ONLY_KINDS) and \
            (problem := speaker_problem(obj["kind"], obj["producer"], [obj["payload"]])):
        raise InvalidEvent(problem)
    unhashed = obj.copy()
    del unhashed["hash"]
    body = fast_canonical(unhashed, parsed)
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
    if long_int_in(obj["kind"], obj["payload"]):
        check_exact_floats(obj["kind"], obj["payload"], fix=parsed)
    return payload_text



def steps_ok(steps: list) -> bool:
    """Whether every step is None or an int in 0..INT64_MAX (check_position's rule, for many at once)."""
    numbered = [s for s in steps if s is not None]
    return not numbered or (set(map(type, numbered)) == {int} and min(numbered) >= 0 and max(numbered) <= INT64_MAX)


def check_position(attempt: Any, seq: Any, step: Any) -> None:
    """Raise InvalidEvent unless attempt and seq are ints in 0..INT64_MAX and step is one or None."""
    for name, value in (("attempt", attempt), ("seq", seq), ("step", step)):
        if not (type(value) is int and 0 <= value <= INT64_MAX) and not (name == "step" and value is None):
            allowed = f"an integer in 0..{INT64_MAX}" + (" or None" if name == "step" else "")
            raise InvalidEvent(f"{name} {value!r} is not {allowed}")
