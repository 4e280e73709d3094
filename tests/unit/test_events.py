"""The event contract: golden vectors, canonical JSON against the reference, seal/check, refusals."""

from __future__ import annotations

import copy
import json
import math
import string

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from runledger.ledger.contract.canonical import _canonical_dict, canonical_json, es_number, event_hash, fast_canonical
from runledger.ledger.contract.columns import NUMERIC_KINDS
from runledger.ledger.contract.events import ACTIONS, KINDS, REGISTRY, DataSource, InvalidEvent, LayerDrops
from runledger.ledger.contract.parsing import parse_json
from runledger.ledger.contract.validation import check_envelope, check_name, check_payload, payloads_valid
from runledger.ledger.emit.sealing import seal, seal_many
from support import REPO
from support.processes import cli
from support.properties import examples
from support.runs import MINIMAL, resealed

SHARED = REPO.parent / "shared"  # CI clones the repo with shared/ beside it
VECTORS = SHARED / "contract-vectors.jsonl"
T0 = "2026-11-29T10:00:00.000000Z"


def sealed(kind: str = "step", seq: int = 0, prev_hash: str = "", **over) -> dict:
    """A sealed event, then `over` set in it (not hashed again); a seq seal refuses is set after too."""
    valid = type(seq) is int and 0 <= seq <= 2**63 - 1
    env, _ = seal("run-1", "worker-0", 0, seq if valid else 0, kind, MINIMAL[kind], 0, prev_hash, time=T0)
    env.update(over, **({} if valid else {"seq": seq}))
    return env


def test_vectors_file_is_there():
    assert VECTORS.exists(), f"contract vectors not found at {VECTORS} (shared/ must be beside the repo)"


@pytest.mark.parametrize("line", VECTORS.read_text().splitlines() if VECTORS.exists() else [])
def test_golden_vector_canonicalises_and_hashes(line):
    vec = json.loads(line)
    env = vec["envelope"]
    without_hash = {k: v for k, v in env.items() if k != "hash"}
    assert canonical_json(without_hash) == vec["canonical_without_hash"]
    assert event_hash(env, canonical_json(env["payload"])) == vec["hash"] == env["hash"]


finite_doubles = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=examples(1000), deadline=None)
@given(st.one_of(finite_doubles, st.integers(-1074, 1023).map(lambda e: math.ldexp(1.0, e)),
                 st.sampled_from([1e21, 1e-7, 1e-6, 9.999999999999999e20, 5e-324, -0.0, 0.1, 2**53 + 2.0])))
def test_es_number_agrees_with_rfc8785(x):
    assert es_number(x) == rfc8785.dumps(x).decode()


json_scalars = st.one_of(
    st.none(), st.booleans(), finite_doubles, st.integers(-(2**53) + 1, 2**53 - 1), st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(json_values)
def test_canonical_json_agrees_with_rfc8785(value):
    """Key order (by UTF-16 code units), string escapes and numbers as the reference writes them."""
    assert canonical_json(value) == rfc8785.dumps(value).decode()


tricky_doubles = st.one_of(
    finite_doubles, st.integers(-(2**60), 2**60).map(float), st.floats(1e-6, 1e-5), st.floats(1e15, 1e22),
    st.sampled_from([0.0, -0.0, 2.0**53, 2.0**53 + 2, 1e16, 1e21, 1e-6, 1e-7, 163840.0]),
)
ascii_values = st.recursive(
    st.one_of(st.none(), st.booleans(), tricky_doubles, st.integers(-(2**53) + 1, 2**53 - 1),
              st.text(st.characters(max_codepoint=127), max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(st.characters(max_codepoint=127), max_size=6), inner, max_size=4)),
    max_leaves=20,
)


def _leaves(value):
    if isinstance(value, dict):
        for key, v in value.items():
            yield key
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def fast_path_must_answer(value) -> bool:
    """Where the fast path may not decline: no double in the zones where orjson's digits and
    ECMAScript's can differ (1e-6 <= |x| < 1e-5; |x| >= 2**53, where integral floats lose their int
    digits and exponents differ up to 1e21), and no text holding ".0" (taken for an integral float)."""
    return not any((type(x) is float and (1e-6 <= abs(x) < 1e-5 or abs(x) >= 2**53)) or (type(x) is str and ".0" in x)
                   for x in _leaves(value))


@settings(max_examples=examples(1000), deadline=None)
@given(st.dictionaries(st.text(st.characters(max_codepoint=127), max_size=6), ascii_values, max_size=6))
def test_the_orjson_fast_path_writes_exactly_rfc8785(value):
    """ASCII text and the doubles where orjson and ECMAScript differ (integral, 1e-6..1e-5, >= 1e16):
    the fast path writes what the reference writes wherever it must answer, and elsewhere either
    declines or writes the same."""
    reference = rfc8785.dumps(value).decode()
    fast = fast_canonical(value)
    if fast_path_must_answer(value):
        assert fast == reference.encode()
    else:
        assert fast in (None, reference.encode())
    assert canonical_json(value) == reference == _canonical_dict(value)


def test_the_fast_path_takes_every_kinds_payload_and_envelope():
    """The properties above allow the fast path to decline; it must not decline what producers send,
    or the speed it exists for is gone (and they would pass with a fast path that declines everything)."""
    for kind, payload in MINIMAL.items():
        env = sealed(kind)
        for value in (payload, env):
            fast = fast_canonical(value)
            assert fast is not None, (kind, value)
            assert fast.decode() == rfc8785.dumps(value).decode()
    step = {**MINIMAL["step"], "lr": 3e-05, "mfu": 1e-7, "tokens_per_s": 163840.0}
    assert fast_canonical(step, numeric=True).decode() == rfc8785.dumps(step).decode()


@pytest.mark.parametrize("value, declines", [
    ({"a": 2**64}, True), ({"a": [2**70, 1.5]}, True), ({"a": -(2**63) - 1}, True),  # past orjson's 64-bit integers
    ({"a": 2.0**60}, True),  # an integral double >= 1e16: ECMAScript writes its digits, orjson an exponent
    ({"a": 1e300}, False),  # written alike: 1e+300
])
def test_the_fast_path_declines_or_agrees_beyond_rfc8785s_integers(value, declines):
    fast = fast_canonical(value)
    assert (fast is None) == declines
    if fast is not None:
        assert fast.decode() == _canonical_dict(value)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_seal_then_check_round_trips(kind):
    producer = "cli" if kind in ("tombstone", "alert_ack") else "worker-0"  # (a person's: speaker_problem)
    env, wire = seal("run-1", producer, 2, 7, kind, MINIMAL[kind], 7, "a" * 64, time=T0)
    assert env["event_id"] == f"run-1:{producer}:2:7"
    assert check_envelope(env) == canonical_json(MINIMAL[kind])
    parsed = parse_json(wire)  # what travels is the canonical text, and it checks out too
    assert parsed == env
    assert check_envelope(parsed) == canonical_json(MINIMAL[kind])


def test_minimal_payloads_cover_every_kind():
    assert set(MINIMAL) == set(KINDS)


@pytest.mark.parametrize("bad", ["../x", "a.b", "A", "", "run\n", "x" * 65, "-lead", "a/b", "a b"])
def test_bad_run_id_is_refused_clearly(bad):
    with pytest.raises(InvalidEvent, match="run_id .* is not allowed: use 1-64 of a-z 0-9"):
        check_name(bad, "run_id")
    with pytest.raises(InvalidEvent, match="run_id"):
        seal(bad, "worker-0", 0, 0, "step", MINIMAL["step"], 0, "")
    env = sealed()
    env["run_id"] = bad
    with pytest.raises(InvalidEvent, match="run_id"):
        check_envelope(env)


def test_producer_with_a_dot_is_refused():
    with pytest.raises(InvalidEvent, match="producer 'worker.0' is not allowed"):
        seal("run-1", "worker.0", 0, 0, "step", MINIMAL["step"], 0, "")
    with pytest.raises(InvalidEvent, match="producer"):
        check_envelope(sealed(producer="worker.0", event_id="run-1:worker.0:0:0"))


@pytest.mark.parametrize("text", [
    '{"loss": NaN}', '{"loss": Infinity}', '{"loss": -Infinity}', '[1, NaN]',
])
def test_parse_json_refuses_nan_and_infinity(text):
    with pytest.raises(InvalidEvent, match="is not allowed in an event"):
        parse_json(text)


def test_nan_loss_in_a_payload_is_refused_even_from_python():
    payload = {**MINIMAL["step"], "loss": float("nan")}
    with pytest.raises(InvalidEvent, match="payload.loss"):
        seal("run-1", "worker-0", 0, 0, "step", payload, 0, "")


@pytest.mark.parametrize("data, reason", [
    (b"{not json", "not JSON"),
    (b'{"a": "\\ud800"}', "lone UTF-16 surrogate"),  # valid JSON syntax, not Unicode text: cannot be hashed
    (b'"\xed\xa0\x80"', "not JSON"),  # a surrogate encoded in (invalid) UTF-8
    (b"[" * 50_000, "nested too deeply"),
])
def test_parse_json_refuses_what_cannot_be_an_event(data, reason):
    with pytest.raises(InvalidEvent, match=reason):
        parse_json(data)


def test_parse_json_keeps_surrogate_pairs():
    assert parse_json(b'"\\ud83d\\ude00"') == "\U0001F600"


def test_unknown_payload_field_is_refused():
    with pytest.raises(InvalidEvent, match="payload.colour"):
        seal("run-1", "worker-0", 0, 0, "step", {**MINIMAL["step"], "colour": "red"}, 0, "")
    env = sealed()
    env["payload"] = {**env["payload"], "colour": "red"}
    with pytest.raises(InvalidEvent, match="payload.colour"):
        check_envelope(resealed(env))  # a correct hash does not make an unknown field acceptable


def test_unknown_envelope_field_is_refused():
    env = sealed()
    env["extra"] = 1
    with pytest.raises(InvalidEvent, match="extra"):
        check_envelope(env)


def test_wrong_hash_is_refused():
    env = sealed()
    env["hash"] = "0" * 64
    with pytest.raises(InvalidEvent, match="hash mismatch"):
        check_envelope(env)
    env = sealed()
    env["payload"] = {**env["payload"], "loss": 2.4}  # content changed, hash kept
    with pytest.raises(InvalidEvent, match="hash mismatch"):
        check_envelope(env)


def test_event_id_rule_is_enforced():
    env = resealed(sealed(event_id="run-1:worker-0:0:1"))  # seq is 0
    with pytest.raises(InvalidEvent, match="breaks the rule run_id:producer:attempt:seq"):
        check_envelope(env)
    env = resealed(sealed(event_id="run-1:worker-1:0:0"))
    with pytest.raises(InvalidEvent, match="event_id"):
        check_envelope(env)


def test_prev_hash_rules():
    with pytest.raises(InvalidEvent, match="prev_hash must be empty for seq 0"):
        check_envelope(resealed(sealed(prev_hash="a" * 64)))
    env = resealed(sealed(seq=1, event_id="run-1:worker-0:0:1", prev_hash=""))
    with pytest.raises(InvalidEvent, match="prev_hash must be the 64-hex hash"):
        check_envelope(env)
    env = resealed(sealed(seq=1, event_id="run-1:worker-0:0:1", prev_hash="a" * 64 + "\n"))
    with pytest.raises(InvalidEvent, match="prev_hash"):
        check_envelope(env)


@pytest.mark.parametrize("bad_time", [
    "2026-02-30T10:00:00Z",  # no such day
    "2026-11-29T24:00:00Z",
    "2026-11-29T10:00:60Z",  # a leap second: no timestamp type stores it
    "0000-01-01T00:00:00Z",
    "2999-01-01T00:00:00Z",  # past what the store's timestamp column holds
    "٢٠٢٦-11-29T10:00:00Z",  # non-ASCII digits
    "2026-11-29 10:00:00Z",
    "2026-11-29T10:00:00+01:00",
])
def test_time_must_be_a_real_storable_utc_time(bad_time):
    with pytest.raises(InvalidEvent, match="time"):
        check_envelope(resealed(sealed(time=bad_time)))
    with pytest.raises(InvalidEvent, match="time"):
        seal("run-1", "worker-0", 0, 0, "step", MINIMAL["step"], 0, "", time=bad_time)


@pytest.mark.parametrize("field, value", [("seq", 2**63), ("step", 2**64), ("attempt", 10**30)])
def test_integers_beyond_int64_are_refused(field, value):
    env = sealed(**{field: value})
    env["event_id"] = f"run-1:worker-0:{env['attempt']}:{env['seq']}"
    with pytest.raises(InvalidEvent, match=field):
        check_envelope(resealed(env))
    with pytest.raises(InvalidEvent, match="payload.tokens"):
        seal("run-1", "worker-0", 0, 0, "step", {**MINIMAL["step"], "tokens": 2**63}, 0, "")


@pytest.mark.parametrize("kind_value", [[], {}, 3, None, "steps"])
def test_a_bad_kind_is_refused_not_crashed_on(kind_value):
    env = copy.deepcopy(sealed())
    env["kind"] = kind_value
    with pytest.raises(InvalidEvent, match="kind"):
        check_envelope(env)


def test_schema_command_prints_every_kind():
    r = cli("schema")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    assert set(schema["kinds"]) == set(KINDS)
    assert schema["kinds"]["step"]["additionalProperties"] is False
    assert {"loss", "grad_norm", "lr", "tokens", "step_time_s"} <= set(schema["kinds"]["step"]["required"])
    assert set(schema["envelope"]["properties"]) >= {"event_id", "run_id", "producer", "attempt", "seq", "kind",
                                                      "time", "step", "schema_version", "prev_hash", "hash", "payload"}


# --------------------------------------------------------------------------------------------
# seal_many: consecutive events at once, the same as seal in turn
# --------------------------------------------------------------------------------------------

LAYER = {"layer": 0, "assignments": 50, "sender_dropped": 1, "receiver_dropped": 2, "drop_fraction": 0.06,
         "expert_loads": [10, 20, 20]}
ALERT = {"alert_id": "a1", "agent": "worker-0", "rule": "mfu_low"}

# Three payloads each: integral floats (written as integers: "2.0" → "2"), -0.0 (→ "0"), and
# strings that hold what an integral float looks like in the text (`1.0,`), which must stay as they are.
SEAL_MANY_CASES = {
    "step, integral floats": ("step", [
        {**MINIMAL["step"], "tokens_per_s": 163840.0, "mfu": 1.0, "z_loss": 0.0},
        {**MINIMAL["step"], "tokens_per_s": 163840.5, "mfu": 0.31, "loss": None, "skipped": True},
        {**MINIMAL["step"], "tokens_per_s": 1e15, "lr": 1.0, "grad_norm": 2.0},
    ]),
    "step, -0.0": ("step", [{**MINIMAL["step"], "loss": -0.0}, MINIMAL["step"], {**MINIMAL["step"], "z_loss": -0.0}]),
    "step, integral floats from 2**53 on": ("step", [
        {**MINIMAL["step"], "tokens_per_s": 2.0**60}, {**MINIMAL["step"], "tokens_per_s": 1e16}, MINIMAL["step"],
    ]),
    "drops, nested layers": ("drops", [
        {**MINIMAL["drops"], "layers": [LAYER, {**LAYER, "layer": 1, "drop_fraction": 0.0}]},
        {**MINIMAL["drops"], "drop_fraction": 1.0, "layers": [{**LAYER, "drop_fraction": 1.0}]},
        {**MINIMAL["drops"], "dispatch": "dropless", "cf_send": 1.25, "layers": []},
    ]),
    "alert, '1.0,' in strings": ("alert", [
        {**ALERT, "message": "1.0,", "evidence": {"ratio": 2.0, "text": "3.0]", "rows": [[1.0, "4.0}"]]}},
        {**ALERT, "message": "mfu 0.5 below 1.0", "evidence": {"x.0": -0.0}},
        {**ALERT, "message": "plain", "severity": "fail"},
    ]),
    "eval, integral losses": ("eval", [
        {"loss": 2.0, "domain_losses": {"web.0": 3.0, "code": 2.5}}, {"loss": 2.5}, {"loss": 3.0, "split": "v1.0,"},
    ]),
}


def sealed_in_turn(kind: str, payloads: list[dict], steps: list, prev: str) -> tuple[list[dict], list[bytes]]:
    envs, texts = [], []
    for seq, (payload, step) in enumerate(zip(payloads, steps), 7):
        env, text = seal("run-1", "worker-0", 2, seq, kind, payload, step, prev, time=T0)
        envs.append(env)
        texts.append(text.encode())
        prev = env["hash"]
    return envs, texts


def test_seal_many_cases_cover_numeric_and_other_kinds():
    assert {k for k, _ in SEAL_MANY_CASES.values()} >= {*NUMERIC_KINDS, "alert"}


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("case", sorted(SEAL_MANY_CASES))
def test_seal_many_is_seal_in_turn(case, n):
    """Byte for byte, and each text is the canonical (RFC 8785) text of its envelope."""
    kind, payloads = SEAL_MANY_CASES[case]
    payloads, steps = copy.deepcopy(payloads[:n]), [70, None, 72][:n]
    ids, hashes, texts = seal_many("run-1", "worker-0", 2, 7, kind, payloads, steps, "a" * 64, time=T0)
    envs, expected_texts = sealed_in_turn(kind, payloads, steps, "a" * 64)
    assert texts == expected_texts
    assert ids == [e["event_id"] for e in envs] and hashes == [e["hash"] for e in envs]
    assert texts == [rfc8785.dumps(env) for env in envs]
    assert [check_envelope(parse_json(t), parsed=True) for t in texts] == [canonical_json(p) for p in payloads]


def test_seal_many_refuses_a_bad_payload_naming_the_event():
    payloads = [MINIMAL["step"], MINIMAL["step"], {**MINIMAL["step"], "tokens": -1}]
    with pytest.raises(InvalidEvent, match=r"^event 2 of 3: payload\.tokens"):
        seal_many("run-1", "worker-0", 0, 0, "step", payloads, None, "", time=T0)


@pytest.mark.parametrize("change, error, reason", [
    ({"kind": "steps"}, InvalidEvent, "unknown kind"),
    ({"run_id": "Run-1"}, InvalidEvent, "run_id"),
    ({"time": "2026-02-30T10:00:00Z"}, InvalidEvent, "not a real date"),
    ({"steps": [1, 2]}, ValueError, "3 payloads but 2 steps"),
])
def test_seal_many_refuses_what_seal_refuses(change, error, reason):
    args = {"run_id": "run-1", "producer": "worker-0", "attempt": 0, "seq": 0, "kind": "step",
            "payloads": [MINIMAL["step"]] * 3, "steps": None, "prev_hash": "", "time": T0, **change}
    with pytest.raises(error, match=reason):
        seal_many(**args)


# --------------------------------------------------------------------------------------------
# payloads_valid's TypedDict mirror of the payload models
# --------------------------------------------------------------------------------------------

LITERAL_WORDS = ["capacity", "dropless", "warn", "fail", "resolved", "completed", "final", "approve", "proposed",
                 "refused", "set_capacity_factor"]
NESTED_KEYS = sorted({*LayerDrops.model_fields, *DataSource.model_fields})
any_scalar = st.one_of(
    st.none(), st.booleans(),
    st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64]),
    st.floats(), st.integers(-(10**6), 10**6).map(float), st.sampled_from([math.nan, math.inf, -math.inf, -0.0]),
    st.text(max_size=4), st.sampled_from(LITERAL_WORDS),
)
any_value = st.recursive(
    any_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(NESTED_KEYS), st.text(max_size=3)), inner, max_size=5),
    ),
    max_leaves=8,
)


# values that fields hold in valid payloads, so that a drawn payload is valid often enough to matter
FIELD_VALUES: dict[str, list] = {}
for _payload in [*MINIMAL.values(), *(p for _, ps in SEAL_MANY_CASES.values() for p in ps)]:
    for _name, _value in _payload.items():
        FIELD_VALUES.setdefault(_name, []).append(_value)


@st.composite
def payload_like(draw, kind: str) -> dict:
    """A valid payload with some fields set to anything (or to a value valid somewhere), some
    removed, maybe an unknown one added."""
    names = [*KINDS[kind].model_fields, "colour"]
    payload = dict(draw(st.sampled_from([{}, MINIMAL[kind], MINIMAL[kind]])))
    for name in draw(st.lists(st.sampled_from(names), max_size=3)):
        payload[name] = draw(st.one_of(any_value, st.sampled_from(FIELD_VALUES.get(name, [None]))))
    for name in draw(st.sets(st.sampled_from(names), max_size=2)):
        payload.pop(name, None)
    return payload


def model_accepts(kind: str, payload: dict) -> bool:
    try:
        KINDS[kind].model_validate(payload)
        return True
    except ValidationError:
        return False


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_payloads_valid_agrees_with_the_models(kind):
    @settings(max_examples=examples(200), deadline=None)
    @given(payload_like(kind))
    def agrees(payload):
        assert payloads_valid(kind, [payload]) == model_accepts(kind, payload)

    agrees()


def test_payloads_valid_takes_a_list_and_refuses_if_any_is_invalid():
    assert payloads_valid("step", [MINIMAL["step"]] * 3)
    assert not payloads_valid("step", [MINIMAL["step"], {**MINIMAL["step"], "lr": math.nan}, MINIMAL["step"]])
    assert not payloads_valid("steps", [MINIMAL["step"]])


# --------------------------------------------------------------------------------------------
# fast_canonical(numeric=True): integral floats found in the text, for values with no strings
# --------------------------------------------------------------------------------------------

dotless_keys = st.text(st.sampled_from(string.ascii_letters + string.digits + "_"), max_size=6)
numeric_values = st.recursive(
    st.one_of(st.none(), st.booleans(), tricky_doubles, st.integers(-(2**53) + 1, 2**53 - 1)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(dotless_keys, inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(st.dictionaries(dotless_keys, numeric_values, max_size=6), st.lists(numeric_values, max_size=6)))
def test_the_numeric_fast_path_writes_exactly_rfc8785(value):
    reference = rfc8785.dumps(value)
    fast = fast_canonical(value, numeric=True)
    if fast_path_must_answer(value):
        assert fast == reference
    else:
        assert fast in (None, reference)


def test_the_numeric_fast_path_writes_integral_floats_as_integers():
    value = {"a": [2.0, 0.0, [1.0], 1.5], "b": {"c": 3.0}, "d": -4.0}
    assert fast_canonical(value, numeric=True) == b'{"a":[2,0,[1],1.5],"b":{"c":3},"d":-4}'


@pytest.mark.parametrize("attempt, seq, step", [(0, 0, True), (0, -1, 0), (2**63, 0, 0), (0, 0, 1.0), (0, True, None), (0, 0, -1)])
def test_seal_refuses_a_position_the_ledger_would_refuse(attempt, seq, step):
    """Caught at emit time, not by the ledger later (a gap in the chain for good), nor spooled as
    text that is not JSON ("step":True)."""
    with pytest.raises(InvalidEvent, match="attempt|seq|step"):
        seal("run-1", "worker-0", attempt, seq, "step", MINIMAL["step"], step, "", time=T0)
    with pytest.raises(InvalidEvent, match="attempt|seq|step"):
        seal_many("run-1", "worker-0", attempt, seq, "step", [MINIMAL["step"]] * 2, [step, 0], "", time=T0)


# --------------------------------------------------------------------------------------------
# Nested payloads are typed: the SQL reads one shape, never guesses
# --------------------------------------------------------------------------------------------

DECISION = MINIMAL["decision"]


@pytest.mark.parametrize("kind, payload, reason", [
    ("run_started", {**MINIMAL["run_started"], "schedule": {"peak_lr": 1e-3, "warmup": 20}}, "schedule.warmup"),
    ("run_started", {**MINIMAL["run_started"], "ladder": {"ladder": "lad"}}, "ladder.name"),
    ("run_started", {**MINIMAL["run_started"], "resumed_from": {"step": 3, "content_hash": "h"}}, "resumed_from.path"),
    ("run_started", {**MINIMAL["run_started"], "parent": {"step": 3, "content_hash": "h"}}, "parent.run_id"),
    ("decision", {**DECISION, "action": "rollback", "params": {"horizon_steps": 5}}, "params.horizon_steps"),
    ("decision", {**DECISION, "action": "approve"}, "params.decision_id"),
    ("decision", {**DECISION, "action": "set_dispatch", "params": {"dispatch": "magic"}}, "params.dispatch"),
    ("decision_applied", {**MINIMAL["decision_applied"], "action": "set_token_horizon",
                          "after": {"horizon_steps": 300, "from_step": 201}}, "after.from_step"),
    ("decision_applied", {**MINIMAL["decision_applied"], "action": "rollback", "after": {"checkpoint": "/c"}}, "after.step"),
])
def test_nested_payloads_are_typed_and_a_decision_fits_its_action(kind, payload, reason):
    with pytest.raises(InvalidEvent, match=reason.replace(".", r"\.")):
        check_payload(kind, payload)
    assert not payloads_valid(kind, [payload])


def test_what_the_worker_writes_for_each_action_is_valid():
    schedule = {"peak_lr": 1e-3, "warmup_steps": 20, "horizon_steps": 400, "min_lr_ratio": 0.05, "anchor_step": None,
                "anchor_lr": None, "tokens_per_step": 64, "horizon_tokens": 25600,
                "context_extension": {"at_step": 300, "seq_len": 256, "done": True, "at": 300}}
    applied = {
        "set_token_horizon": (schedule, {**schedule, "horizon_steps": 300, "anchor_step": 201, "anchor_lr": 5e-4}),
        "set_capacity_factor": ({"dispatch": "capacity", "cf_send": 1.0, "cf_recv": 1.0}, {"cf_recv": 1.5}),
        "hold_context_extension": ({"held": False}, {"held": True}),
        "set_z_loss_weight": ({"logit_z_coef": None}, {"logit_z_coef": 1e-4}),
        "checkpoint_now": ({}, {"checkpoint_step": 9}),
        "rollback": ({"step": 9}, {"step": 5, "checkpoint": "/ckpt/5", "content_hash": "ab"}),
    }
    assert set(applied) <= set(ACTIONS)
    for action, (before, after) in applied.items():
        check_payload("decision_applied", {"decision_id": "d", "action": action, "before": before, "after": after})
    check_payload("run_started", {**MINIMAL["run_started"], "schedule": schedule,
                                  "resumed_from": {"path": "/ckpt/5", "step": 5, "content_hash": "ab"},
                                  "parent": {"run_id": "base", "step": 5, "content_hash": "ab"},
                                  "ladder": {"name": "lad", "rung": 0, "target": "big", "preset": "tiny",
                                             "tokens_per_active_param": 20.0}})


def test_every_kind_s_view_is_in_views_sql():
    views = (REPO / "queries" / "views.sql").read_text()
    for kind, k in REGISTRY.items():
        assert f"create or replace view {k.view} as" in views, (kind, k.view)



@pytest.mark.parametrize("producer, allowed", [("cli", True), ("ui", True), ("notify", True), ("worker-0", False),
                                               ("agent-drops", False)])
def test_only_a_person_or_notify_acknowledges_an_alert(producer, allowed):
    env, _ = seal("run-1", producer, 0, 0, "alert_ack", MINIMAL["alert_ack"], None, "", time=T0)
    if allowed:
        assert check_envelope(env) == canonical_json(MINIMAL["alert_ack"])
    else:
        with pytest.raises(InvalidEvent, match=f"an alert_ack is a person's or notify's .*not producer '{producer}'"):
            check_envelope(env)
