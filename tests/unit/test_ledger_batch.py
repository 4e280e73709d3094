"""Batch messages checked at once (`check_batch`, `plain_batch`): the same verdicts as one at a time.

A batch in the plain form (what `Emitter` sends) is checked a column at a time and stored whole;
anything else is declined (None) and taken event by event (`check_envelope`), which says why an event
is invalid. These tests build batches with `seal`, break them one way at a time, and hold the two
paths to the same answer; then the ledger stores batches and overlaps of batches once each.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

import orjson
import pytest

from runledger.ledger.check.verify import verify
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.events import INT64_MAX, MAX_EVENT_BYTES, InvalidEvent, make_event_id
from runledger.ledger.contract.validation import check_envelope
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest.batch import check_batch
from runledger.ledger.ingest.service import Ledger, decode_message, plain_batch
from runledger.ledger.storage.index import SeqIndex
from runledger.tools.produce import step_payload
from support.batches import Batch, text
from support.reading import stored_ids

T0 = "2026-11-29T10:00:00.000000Z"
RUN, PRODUCER = "run-1", "worker-0"


def chain(payloads: list[dict], kind: str = "step", first: int = 0, prev: str = "") -> list[dict]:
    """Sealed, linked events of one chain, seqs first, first+1, ..."""
    envs = []
    for seq, payload in enumerate(payloads, first):
        env, _ = seal(RUN, PRODUCER, 0, seq, kind, payload, seq, prev, time=T0)
        envs.append(env)
        prev = env["hash"]
    return envs


def wire(envs: list[dict]) -> bytes:
    """A batch's bytes as the Emitter writes them: the canonical texts in a JSON array."""
    return b"[" + b",".join(canonical_json(e).encode() for e in envs) + b"]"


def batch_of(envs: list[dict], kind: str = "step") -> Batch:
    data = wire(envs)
    return Batch(RUN, kind, data, orjson.loads(data))


def steps(first: int = 0, n: int = 5) -> Batch:
    return batch_of(chain([step_payload(i) for i in range(first, first + n)], first=first))


def hash_of(text: bytes) -> str:
    """The hash of an envelope whose text without `hash` is `text`: what a producer that hashes
    the bytes it sends (canonical or not) would put in `hash`."""
    return hashlib.sha256(text).hexdigest()


def rehash(envs: list[dict], start: int) -> list[dict]:
    """Hash envs[start:] again over their canonical text and relink the chain after them."""
    for i in range(start, len(envs)):
        if i > start:
            envs[i]["prev_hash"] = envs[i - 1]["hash"]
        envs[i]["hash"] = hash_of(canonical_json({k: v for k, v in envs[i].items() if k != "hash"}).encode())
    return envs


def edit(i: int, **fields):
    """A mutation: set fields of event i, hash it again, relink the events after it."""
    def mutate(b: Batch) -> Batch:
        envs = orjson.loads(b.data)
        envs[i].update(fields)
        return batch_of(rehash(envs, i))
    return mutate


def edit_all(**fields):
    """A mutation: set fields of every event (and its event_id by the rule), hash them all again."""
    def mutate(b: Batch) -> Batch:
        envs = orjson.loads(b.data)
        for env in envs:
            env.update(fields)
            env["event_id"] = make_event_id(env["run_id"], env["producer"], env["attempt"], env["seq"])
        return batch_of(rehash(envs, 0))
    return mutate


def drop_key(i: int, key: str):
    def mutate(b: Batch) -> Batch:
        envs = orjson.loads(b.data)
        del envs[i][key]
        return batch_of(rehash(envs, i))
    return mutate


def text_hashed_as_sent(old: bytes, new: bytes, i: int = 2):
    """Write event i's text non-canonically (`old` → `new`) and hash it over the text as written:
    what a producer that hashes its own bytes, not the canonical ones, would send."""
    def mutate(b: Batch) -> Batch:
        envs = orjson.loads(b.data)
        body = canonical_json({k: v for k, v in envs[i].items() if k != "hash"}).encode()
        assert old in body
        body = body.replace(old, new, 1)
        envs[i]["hash"] = hash_of(body)
        cut = body.index(b',"kind":')
        if i + 1 < len(envs):  # the events after it link to the hash it was sent with
            envs[i + 1]["prev_hash"] = envs[i]["hash"]
            rehash(envs, i + 1)
        texts = [canonical_json(e).encode() for e in envs]
        texts[i] = body[:cut] + b',"hash":"' + envs[i]["hash"].encode() + b'"' + body[cut:]
        data = b"[" + b",".join(texts) + b"]"
        return Batch(b.run_id, b.kind, data, orjson.loads(data))
    return mutate


def payload_edit(i: int, hashed: bool, **fields):
    """A mutation: set payload fields of event i; hash it again (and relink) or keep its hash."""
    def mutate(b: Batch) -> Batch:
        envs = orjson.loads(b.data)
        envs[i]["payload"].update(fields)
        return batch_of(rehash(envs, i) if hashed else envs)
    return mutate


def seq_gap(b: Batch) -> Batch:
    envs = orjson.loads(b.data)
    del envs[2]
    envs[2]["prev_hash"] = envs[1]["hash"]  # linked, but seq 3 follows seq 1
    return batch_of(rehash(envs, 2))


def one_event(b: Batch) -> Batch:
    return batch_of(b.envs[:1])


def nested_deeper_than_orjson_writes(b: Batch) -> Batch:
    """Alerts whose evidence is nested 300 deep: orjson reads that deep, but writes 254 at most."""
    deep: list | int = 1
    for _ in range(300):
        deep = [deep]
    alert = {"alert_id": "a", "agent": PRODUCER, "rule": "r", "message": "m", "evidence": {"deep": deep}}
    return batch_of(chain([alert, alert], "alert"), "alert")


def last_hash_not_a_string(b: Batch) -> Batch:
    envs = orjson.loads(b.data)
    envs[-1]["hash"] = None
    data = orjson.dumps(envs, option=orjson.OPT_SORT_KEYS)
    return Batch(b.run_id, b.kind, data, orjson.loads(data))


def unlinked_start(b: Batch) -> Batch:
    """A batch from seq 3 whose first event has no prev_hash."""
    return batch_of(chain([step_payload(i) for i in range(3, 8)], first=3, prev=""))


def past_int64(b: Batch) -> Batch:
    """Seqs INT64_MAX - 2 .. INT64_MAX + 2: the last two cannot be stored."""
    envs = chain([step_payload(i) for i in range(5)], first=1, prev="a" * 64)  # (seal refuses such seqs)
    for i, env in enumerate(envs):
        env["seq"], env["step"] = INT64_MAX - 2 + i, 1
        env["event_id"] = f"{RUN}:{PRODUCER}:0:{env['seq']}"
    return batch_of(rehash(envs, 0))


ALL = (0, 1, 2, 3, 4)


def case(what: str, mutate, reason: str | None, rejected: tuple):
    """What is wrong with a batch, how to make it so, the per-event path's reason and the entries it
    rejects (none where each event is valid alone)."""
    return pytest.param(mutate, reason, rejected, id=what)


MUTATIONS = [
    case("payload changed, hash kept", payload_edit(2, hashed=False, loss=1.25), "hash mismatch", (2,)),
    case("an extra envelope key", edit(2, colour="red"), "colour", (2,)),
    case("a missing envelope key", drop_key(2, "step"), "step", (2,)),
    case("the subject's run_id is another", lambda b: replace(b, run_id="run-2"), "subject says run", ALL),
    case("the subject's kind is another", lambda b: replace(b, kind="eval"), "subject says kind", ALL),
    case("one event of another run", edit(2, run_id="run-2", event_id="run-2:worker-0:0:2"), "subject says run", (2,)),
    case("one event of another kind", edit(2, kind="eval", payload={"loss": 2.0}), "subject says kind", (2,)),
    case("one event of another producer", edit(2, producer="worker-1", event_id="run-1:worker-1:0:2"), None, ()),
    case("a seq gap", seq_gap, None, ()),
    case("event_id breaks the rule", edit(2, event_id="run-1:worker-0:0:99"), "event_id .* breaks the rule", (2,)),
    case("attempt is a bool", edit_all(attempt=True), "attempt", ALL),
    case("a negative step", edit(2, step=-1), "step", (2,)),
    case("no such day", edit(2, time="2026-02-30T00:00:00Z"), "is not a real date", (2,)),
    case("a time with an offset", edit(2, time="2026-11-29T10:00:00.5+01:00"), "time", (2,)),
    case("an invalid payload", payload_edit(2, hashed=True, tokens=-1), "payload.tokens", (2,)),
    case("a space after a comma", text(b',"kind"', b', "kind"'), None, ()),
    case("a space after a comma, hashed as sent", text_hashed_as_sent(b',"producer"', b', "producer"'),
         "hash mismatch", (2,)),
    case("an integral float as 2.0", text(b'"tokens_per_s":163840', b'"tokens_per_s":163840.0'), None, ()),
    case("an integral float as 2.0, hashed as sent",
         text_hashed_as_sent(b'"tokens_per_s":163840', b'"tokens_per_s":163840.0'), "hash mismatch", (2,)),
    case("1e16 as 1e+16, hashed as sent", text_hashed_as_sent(b'"tokens_per_s":163840', b'"tokens_per_s":1e+16'),
         "hash mismatch", (2,)),
    case("0.000002 as 2e-6, hashed as sent", text_hashed_as_sent(b'"step_time_s":0.05', b'"step_time_s":2e-6'),
         "hash mismatch", (2,)),
    case("a single event", one_event, None, ()),
    case("prev_hash does not link", edit(2, prev_hash="f" * 64), None, ()),
    case("seq 0 with a prev_hash", edit(0, prev_hash="a" * 64), "prev_hash must be empty", (0,)),
    case("a later seq without a prev_hash", unlinked_start, "prev_hash must be the 64-hex", (0,)),
    case("seqs past int64", past_int64, "seq", (3, 4)),
    case("attempt past int64", edit_all(attempt=INT64_MAX + 1), "attempt", ALL),
    case("a step past int64", edit(2, step=INT64_MAX + 1), "step", (2,)),
    case("a producer name not allowed", edit_all(producer="Worker-0"), "producer", ALL),
    case("another schema_version", edit_all(schema_version=2), "schema_version", ALL),
    # both once made check_batch raise, and the ledger die on the message
    case("nested deeper than orjson writes", nested_deeper_than_orjson_writes, None, ()),
    case("the last hash not a string", last_hash_not_a_string, "hash", (4,)),
]


def test_a_valid_batch_gets_the_payload_texts_check_envelope_gives():
    b = steps()
    assert check_batch(b.data, b.envs, RUN, "step") == [check_envelope(e, parsed=True) for e in b.envs]


@pytest.mark.parametrize("kind, payloads", [
    ("alert", [{"alert_id": f"a{i}", "agent": PRODUCER, "rule": "mfu_low", "message": f"MFU {i}.5 below plan",
                "evidence": {"prev_hash": "x", "payload": {"kind": "step"}, "rows": [[1.5, None, True]]}}
               for i in range(3)]),
    ("drops", [{"dispatch": "capacity", "assignments": 100, "dropped": 3, "drop_fraction": 0.03,
                "layers": [{"layer": 0, "assignments": 50, "sender_dropped": 1, "receiver_dropped": 2,
                            "drop_fraction": 0.06, "expert_loads": [10, 20, 20]}]}] * 3),
])
def test_batches_of_other_kinds_agree_with_check_envelope(kind, payloads):
    """Payloads with strings, nested values, and envelope key names inside a payload."""
    b = batch_of(chain(payloads, kind), kind)
    assert check_batch(b.data, b.envs, RUN, kind) == [check_envelope(e, parsed=True) for e in b.envs]


@pytest.mark.parametrize("mutate, reason, rejected", MUTATIONS)
def test_a_batch_out_of_the_plain_form_is_declined_and_each_event_judged_alone(mutate, reason, rejected):
    b = mutate(steps())
    assert check_batch(b.data, b.envs, b.run_id, b.kind) is None
    assert plain_batch(b.subject, b.data) is None
    good, bad = decode_message(b.subject, b.data, 1)  # the per-event path: check_envelope on each
    assert [q.reason.split(":")[0] for q in bad] == [f"batch entry {i}" for i in rejected]
    assert all(re.search(reason, q.reason) for q in bad), [q.reason for q in bad]
    assert len(good) == len(b.envs) - len(rejected)
    if rejected and "subject" not in reason:  # events invalid in themselves: check_envelope says so too
        for i in rejected:
            with pytest.raises(InvalidEvent, match=reason):
                check_envelope(b.envs[i], parsed=True)


def test_keys_in_code_point_order_hashed_as_sent_are_declined():
    """JCS orders keys by UTF-16 code units: U+1F600 (D83D DE00) before U+E000; code point order
    (orjson's) puts them the other way round."""
    alert = {"alert_id": "a", "agent": PRODUCER, "rule": "r", "message": "m"}
    payloads = [{**alert, "evidence": {"a": 1}}, {**alert, "evidence": {"\U0001F600": 1, "\ue000": 2}}]
    jcs, code_point_order = '{"\U0001F600":1,"\ue000":2}'.encode(), '{"\ue000":2,"\U0001F600":1}'.encode()
    b = text_hashed_as_sent(jcs, code_point_order, i=1)(batch_of(chain(payloads, "alert"), "alert"))
    assert check_batch(b.data, b.envs, RUN, "alert") is None
    with pytest.raises(InvalidEvent, match="hash mismatch"):
        check_envelope(b.envs[1], parsed=True)


def test_a_batch_whose_payload_holds_the_separator_is_declined_but_valid():
    """`},{"attempt":` inside a payload: the text cannot be cut into events by it."""
    payloads = [{"alert_id": "a", "agent": PRODUCER, "rule": "r", "message": "m",
                 "evidence": {"rows": [{"attempt": 1}, {"attempt": 2}]}}] * 2
    b = batch_of(chain(payloads, "alert"), "alert")
    assert check_batch(b.data, b.envs, RUN, "alert") is None
    for env in b.envs:
        check_envelope(env, parsed=True)  # valid alone (it raises otherwise)


def test_a_batch_with_an_event_past_the_size_limit_is_declined_and_that_event_refused():
    alert = {"alert_id": "a", "agent": PRODUCER, "rule": "r"}
    payloads = [{**alert, "message": "m"}, {**alert, "message": "m" * MAX_EVENT_BYTES}]
    b = batch_of(chain(payloads, "alert"), "alert")
    assert plain_batch(b.subject, b.data) is None
    good, bad = decode_message(b.subject, b.data, 1)
    assert len(good) == 1 and [q.reason.split(":")[0] for q in bad] == ["batch entry 1"]
    assert "exceeds" in bad[0].reason


@pytest.mark.parametrize("subject, data", [
    ("runledger.run-1.step", canonical_json(steps().envs[0]).encode()),  # one envelope, not an array
    ("runledger.run-1", steps().data),
    ("other.run-1.step", steps().data),
    ("runledger.run-1.step.x", steps().data),
    ("runledger.run-1.step", b"[not json"),
])
def test_plain_batch_declines_what_is_not_a_batch_on_a_good_subject(subject, data):
    assert plain_batch(subject, data) is None


def test_plain_batch_takes_a_valid_batch():
    b = steps()
    envs, texts = plain_batch(b.subject, b.data)
    assert envs == b.envs and texts == [check_envelope(e) for e in b.envs]


# ----------------------------------------------------------------------------------- the ledger


def ids(first: int, n: int) -> list[str]:
    return sorted(f"{RUN}:{PRODUCER}:0:{s}" for s in range(first, first + n))


def test_a_batch_delivered_again_stores_nothing_and_counts_duplicates(root):
    b = steps()
    ledger = Ledger(root)
    ledger.write(ledger.decode([(b.subject, b.data, 1)]))
    ledger.commit()
    assert ledger.counters.stored == 5
    ledger.write(ledger.decode([(b.subject, b.data, 2)]))
    ledger.commit()
    assert (ledger.counters.stored, ledger.counters.duplicates, ledger.counters.quarantined) == (5, 5, 0)
    assert stored_ids(root) == ids(0, 5)


def overlapping() -> tuple[Batch, Batch]:
    """Seqs 0..3 and 2..5 of one chain: two valid batches that share seqs 2 and 3."""
    first = steps(0, 4)
    second = batch_of(chain([step_payload(i) for i in range(2, 6)], first=2, prev=first.envs[1]["hash"]))
    assert plain_batch(second.subject, second.data) is not None  # valid: declined only for the overlap
    return first, second


def test_a_batch_overlapping_a_stored_one_stores_only_its_new_half(root):
    first, second = overlapping()
    ledger = Ledger(root)
    ledger.write(ledger.decode([(first.subject, first.data, 1)]))
    ledger.commit()
    ledger.write(ledger.decode([(second.subject, second.data, 2)]))
    ledger.commit()
    assert (ledger.counters.stored, ledger.counters.duplicates) == (6, 2)
    assert stored_ids(root) == ids(0, 6)
    assert verify(root).ok


def test_overlapping_batches_in_one_fetch_are_stored_once(root):
    first, second = overlapping()
    ledger = Ledger(root)
    ledger.write(ledger.decode([(first.subject, first.data, 1), (second.subject, second.data, 2)]))
    ledger.commit()
    assert (ledger.counters.stored, ledger.counters.duplicates) == (6, 2)
    assert stored_ids(root) == ids(0, 6)


def test_a_batch_after_its_events_one_by_one_in_one_fetch_is_stored_once(root):
    b = steps()
    singles = [(b.subject, canonical_json(e).encode(), i) for i, e in enumerate(b.envs[:3], 1)]
    ledger = Ledger(root)
    ledger.write(ledger.decode([*singles, (b.subject, b.data, 9)]))
    ledger.commit()
    assert (ledger.counters.stored, ledger.counters.duplicates) == (5, 3)
    assert stored_ids(root) == ids(0, 5)


def test_a_batch_conflicting_with_stored_events_is_quarantined_event_by_event(root):
    ledger = Ledger(root)
    ledger.write(ledger.decode([(steps().subject, steps().data, 1)]))
    ledger.commit()
    other = batch_of(chain([{**step_payload(i), "loss": 9.0} for i in range(5)]))  # same ids, other content
    decoded = ledger.decode([(other.subject, other.data, 2)])
    assert len(decoded.rejected) == 5 and all("different hash" in q.reason for q in decoded.rejected)
    ledger.write(decoded)
    ledger.commit()
    assert ledger.counters.stored == 5 and stored_ids(root) == ids(0, 5)


CHAIN = (RUN, PRODUCER, 0)


@pytest.mark.parametrize("stored, first, count, expected", [
    ([], 0, 5, False),
    ([0, 1, 2], 2, 3, True),  # the last stored seq is the first asked
    ([0, 1, 2], 3, 3, False),  # just after
    ([0, 1, 2], 0, 1, True),
    ([0, 1, 2, 10], 8, 2, False),  # seqs 8, 9: between the gapless run and the one above it
    ([0, 1, 2, 10], 8, 3, True),  # 8..10
    ([0, 1, 2, 10], 11, 5, False),
    ([0, 1, 2, 10], 10, 1, True),
    ([5], 0, 5, False),  # 0..4: nothing stored below 5
    ([5], 3, 3, True),
])
def test_seq_index_any_stored(stored, first, count, expected):
    index = SeqIndex()
    index.add_all([(*CHAIN, s) for s in stored])
    assert index.any_stored(CHAIN, first, count) is expected


def test_seq_index_any_stored_is_per_chain():
    index = SeqIndex()
    index.add_all([(*CHAIN, s) for s in range(5)])
    assert not index.any_stored((RUN, PRODUCER, 1), 0, 5)
    assert not index.any_stored((RUN, "worker-1", 0), 0, 5)


@pytest.mark.parametrize("stored, first, count", [
    ([], 0, 5),
    ([], 3, 2),
    ([0, 1, 2], 3, 4),  # continues the gapless run
    ([0, 1, 2], 5, 3),  # leaves a gap
    ([0, 1, 2], 1, 4),  # overlaps it
    ([0, 1, 2, 10], 3, 7),  # fills the gap up to the seq above it
])
def test_seq_index_add_range_is_adding_each_seq(stored, first, count):
    by_range, by_seq = SeqIndex(), SeqIndex()
    for index in (by_range, by_seq):
        index.add_all([(*CHAIN, s) for s in stored])
    by_range.add_range(CHAIN, first, count)
    for s in range(first, first + count):
        by_seq.add((*CHAIN, s))
    assert by_range.chains == by_seq.chains
