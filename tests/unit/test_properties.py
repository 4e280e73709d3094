"""Whatever arrives on the wire, the ledger's decoder answers: accepted (valid, hash true, storable) or
rejected (with a one-line reason, and storable in quarantine). It never raises."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runledger.ledger.contract.canonical import canonical_json, event_hash
from runledger.ledger.contract.events import KINDS, TIME_RE
from runledger.ledger.contract.validation import check_envelope
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest.service import decode_message
from runledger.ledger.storage import rows, store
from support.properties import examples
from support.runs import MINIMAL

SETTINGS = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SUBJECTS = st.one_of(
    st.sampled_from(["runledger.run-1.step", "runledger.run-1.batch", "runledger.run-1.eval", "runledger.other.step",
                     "runledger.run-1", "other.run-1.step", "runledger.run-1.step.x", ""]),
    st.builds(lambda k: f"runledger.run-1.{k}", st.sampled_from(sorted(KINDS))),
)

# Strings include lone surrogates and control characters: both are legal in JSON text.
texts = st.one_of(st.text(max_size=12), st.sampled_from(["\ud800", "a\udfffb", "\x00", "run-1", "../x", "é" * 3]))
scalars = st.one_of(
    st.none(), st.booleans(), st.floats(), st.integers(), st.integers(-(2**63), 2**64), texts,
)
json_documents = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=15,
)
times = st.one_of(st.from_regex(TIME_RE, fullmatch=True), st.just("2026-11-29T10:00:00.5Z"))


def valid_envelope(kind: str, seq: int) -> dict:
    producer = "cli" if kind in ("tombstone", "alert_ack") else "worker-0"  # (a person's: speaker_problem)
    env, _ = seal("run-1", producer, 0, seq, kind, copy.deepcopy(MINIMAL[kind]), seq, "" if seq == 0 else "b" * 64,
                  time="2026-11-29T10:00:00.000001Z")
    return env


@st.composite
def mutated_envelopes(draw) -> dict:
    """A valid envelope, changed in one to three ways, usually re-hashed so that the change is what is judged."""
    env = valid_envelope(draw(st.sampled_from(sorted(KINDS))), draw(st.sampled_from([0, 1, 5])))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["set", "delete", "add", "payload_set", "payload_delete", "payload_add", "time"]))
        payload = env["payload"] if isinstance(env.get("payload"), dict) else None
        if how == "set":
            env[draw(st.sampled_from(sorted(env)))] = draw(json_documents)
        elif how == "delete" and env:
            del env[draw(st.sampled_from(sorted(env)))]
        elif how == "add":
            env[draw(texts)] = draw(json_documents)
        elif how == "payload_set" and payload:
            payload[draw(st.sampled_from(sorted(payload)))] = draw(json_documents)
        elif how == "payload_delete" and payload:
            del payload[draw(st.sampled_from(sorted(payload)))]
        elif how == "payload_add" and payload is not None:
            field = draw(st.one_of(st.sampled_from(sorted(KINDS["step"].model_fields) + ["seed", "layers"]), texts))
            payload[field] = draw(json_documents)
        elif how == "time":
            env["time"] = draw(times)
    if draw(st.booleans()):
        try:  # re-hash, so that the check reaches the changed field instead of stopping at the hash
            env["hash"] = event_hash(env, canonical_json(env["payload"]))
        except Exception:
            pass
    if draw(st.booleans()):
        try:
            env["event_id"] = f"{env['run_id']}:{env['producer']}:{env['attempt']}:{env['seq']}"
            env["hash"] = event_hash(env, canonical_json(env["payload"]))
        except Exception:
            pass
    return env


def json_bytes(value, ascii_escapes: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_escapes).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="rl-props-") as d:
        yield Path(d)


def check_decoded(subject: str, data: bytes, scratch: Path) -> tuple[list, list]:
    good, bad = decode_message(subject, data, 7)  # must not raise, whatever the input
    run_id = subject.split(".")[1] if subject.count(".") == 2 else None
    for env, payload_text in good:
        assert check_envelope(env) == payload_text
        assert env["hash"] == event_hash(env, payload_text)
        assert env["run_id"] == run_id
    for q in bad:
        assert isinstance(q.reason, str) and q.reason.strip(), q
        assert "\n" not in q.reason, q.reason
        assert q.stream_seq == 7 and q.subject == subject
    # what is accepted can be stored, and what is refused can be kept in quarantine: no write crashes the service
    if good:
        store.write_events(scratch, [rows.StoredEvent(env, text, 7) for env, text in good])
    store.write_quarantine(scratch, bad)
    assert bool(good) or bool(bad), "every message is either stored or quarantined"
    return good, bad


@SETTINGS
@given(SUBJECTS, st.binary(max_size=600))
def test_arbitrary_bytes_never_crash_the_decoder(scratch, subject, data):
    check_decoded(subject, data, scratch)


@SETTINGS
@given(SUBJECTS, json_documents, st.booleans())
def test_arbitrary_json_never_crashes_the_decoder(scratch, subject, value, ascii_escapes):
    try:
        data = json_bytes(value, ascii_escapes)
    except ValueError:  # json.dumps of a float('nan') with allow_nan is fine; anything else we cannot send
        return
    good, _ = check_decoded(subject, data, scratch)
    assert not good  # no valid envelope by chance: it would need its own SHA-256 in its `hash`


@SETTINGS
@given(mutated_envelopes(), st.booleans(), st.booleans())
def test_mutated_envelopes_never_crash_the_decoder(scratch, env, as_batch, ascii_escapes):
    kind = env.get("kind") if isinstance(env.get("kind"), str) else "step"
    subject = "runledger.run-1.step" if as_batch else f"runledger.run-1.{kind}"  # a batch is on its kind's subject
    body = [env, valid_envelope("step", 0)] if as_batch else env
    good, bad = check_decoded(subject, json_bytes(body, ascii_escapes), scratch)
    if as_batch:  # the valid entry of a batch is judged on its own, unless the message is not JSON text at all
        whole_message_refused = not good and len(bad) == 1 and bad[0].event_id is None
        assert whole_message_refused or any(e["event_id"] == "run-1:worker-0:0:0" and e["kind"] == "step" for e, _ in good) \
            or any(q.event_id == "run-1:worker-0:0:0" for q in bad)  # (a changed copy of it is a conflict)


@SETTINGS
@given(st.sampled_from(sorted(KINDS)), st.integers(0, 3))
def test_valid_envelopes_are_accepted_on_their_subject(scratch, kind, seq):
    env = valid_envelope(kind, seq)
    good, bad = check_decoded(f"runledger.run-1.{kind}", json_bytes(env, False), scratch)
    assert bad == [] and [e for e, _ in good] == [env]
    good, bad = check_decoded("runledger.run-2.step" if kind != "step" else "runledger.run-2.step",
                              json_bytes(env, False), scratch)
    assert good == [] and "subject says run 'run-2'" in bad[0].reason
