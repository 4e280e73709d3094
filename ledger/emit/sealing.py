"""Sealing events: a producer's payloads become hashed, chained envelopes and their canonical wire text.

`seal(...)` checks one event (names, position, payload) and returns its envelope and text;
`seal_many(...)` does the same for consecutive events of one kind at a third of the CPU (one
validation call, one orjson call, each envelope's text put together around its payload's). Each
event's `prev_hash` is the hash of the one before it in its (run_id, producer, attempt) chain.
"""

from __future__ import annotations

import hashlib
import logging
import time

from runledger.ledger.contract.canonical import (canonical_json, envelope_text, event_hash, fast_canonical, fast_canonical_texts)
from runledger.ledger.contract.columns import NUMERIC_KINDS
from runledger.ledger.contract.events import KINDS, SCHEMA_VERSION, InvalidEvent, make_event_id
from runledger.ledger.contract.validation import (check_exact_floats, check_name, check_payload, check_position, check_time, long_int_in, names_ok, payloads_valid, steps_ok)

log = logging.getLogger(__name__)

_second_text: list = [None, ""]  # (second, its formatted text): formatting dominates otherwise


def utc_now() -> str:
    """Now as RFC 3339 UTC with microseconds, e.g. 2026-11-29T10:00:00.123456Z."""
    t = time.time()
    sec = int(t)
    if _second_text[0] != sec:
        _second_text[:] = [sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))]
    return f"{_second_text[1]}.{int((t - sec) * 1e6):06d}Z"


def seal(
    run_id: str, producer: str, attempt: int, seq: int, kind: str, payload: dict,
    step: int | None, prev_hash: str, time: str | None = None, checked: bool = True,
) -> tuple[dict, str]:
    """Build a valid, hashed envelope; return (envelope, its canonical wire text).

    Raises InvalidEvent for a bad name or payload, so a producer learns at `emit` time. With
    `checked=False` the payload is not checked (an event accepted already, sealed as it was given: the
    ledger quarantines it if it is bad, naming why).
    """
    if not names_ok(run_id, producer):
        check_name(run_id, "run_id")
        check_name(producer, "producer")
    if time is not None:
        check_time(time)
    check_position(attempt, seq, step)
    if checked:
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
    payload_text = fast_canonical(payload, numeric=kind in NUMERIC_KINDS)
    if checked and long_int_in(kind, payload):
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
    UTF-8), the same as `seal` called for each in turn (tests/unit/test_events.py compares them), at a
    third of the CPU: the payloads are validated in one call and written by orjson in one, and each
    envelope's text is put together around its payload's. The events share one `time`.
    Raises InvalidEvent (naming the event) and seals none if one is bad.
    """
    n = len(payloads)
    steps = [None] * n if steps is None else list(steps)
    if len(steps) != n:
        raise ValueError(f"{n} payloads but {len(steps)} steps")
    if not names_ok(run_id, producer):
        check_name(run_id, "run_id")
        check_name(producer, "producer")
    time = utc_now() if time is None else check_time(time)
    if not n:
        return [], [], []
    check_position(attempt, seq, None)
    check_position(attempt, seq + n - 1, None)
    if not steps_ok(steps):
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
    payload_texts = fast_canonical_texts(payloads, kind in NUMERIC_KINDS)
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
    for i, payload in enumerate(payloads):
        if long_int_in(kind, payload):
            try:
                check_exact_floats(kind, payloads[i])
            except InvalidEvent as err:
                raise InvalidEvent(f"event {i} of {n}: {err}") from None
    return (ids, *_envelope_texts(run_id, producer, attempt, seq, kind, time, steps, payload_texts, prev_hash))


def seal_accepted(
    run_id: str, producer: str, attempt: int, seq: int, records: list[tuple[str, int | None, str, dict]],
    prev_hash: str,
) -> tuple[list[str], list[str], list[bytes], list[str]]:
    """Seal events accepted earlier (`Spool.accept`: each (kind, step, time, payload) given its seq and
    time then): (event_ids, hashes, canonical wire texts, kinds), the same bytes as `seal` called for
    each in turn at its time (tests/unit/test_intake.py compares them). An accepted event is sealed
    whatever it holds: one that does not pass its kind's check is sealed as given, with an error logged,
    and the ledger quarantines it naming why (it was accepted: it is never dropped here)."""
    ids, hashes, texts, kinds = [], [], [], []
    i = 0
    while i < len(records):
        kind = records[i][0]
        j = i + 1
        while j < len(records) and records[j][0] == kind:
            j += 1
        group = records[i:j]
        payloads = [r[3] for r in group]
        payload_texts = None
        if kind in KINDS and payloads_valid(kind, payloads) and not any(long_int_in(kind, p) for p in payloads):
            payload_texts = fast_canonical_texts(payloads, kind in NUMERIC_KINDS)
        if payload_texts is not None:
            h, t = _envelope_texts(run_id, producer, attempt, seq + i, kind, "", [r[1] for r in group], payload_texts,
                                   prev_hash, [r[2] for r in group])
        else:  # one at a time, by the reference writer
            h, t = [], []
            for n, (_, step, at, payload) in enumerate(group):
                try:
                    env, text = seal(run_id, producer, attempt, seq + i + n, kind, payload, step, prev_hash, at)
                except InvalidEvent as err:
                    log.error("chain %s:%s:%d seq %d: an accepted %s event does not pass its check (%s); sealed as "
                              "given, for the ledger to quarantine", run_id, producer, attempt, seq + i + n, kind, err)
                    env, text = seal(run_id, producer, attempt, seq + i + n, kind, payload, step, prev_hash, at,
                                     checked=False)
                h.append(prev_hash := env["hash"])
                t.append(text.encode())
        ids += [f"{run_id}:{producer}:{attempt}:{s}" for s in range(seq + i, seq + j)]
        hashes += h
        texts += t
        kinds += [kind] * len(group)
        prev_hash = h[-1]
        i = j
    return ids, hashes, texts, kinds


def _envelope_texts(
    run_id: str, producer: str, attempt: int, seq: int, kind: str, time: str, steps: list[int | None],
    payload_texts: list[bytes], prev_hash: str, times: list[str] | None = None,
) -> tuple[list[str], list[bytes]]:
    """(hashes, canonical texts) of consecutive envelopes, put together around their payloads' texts,
    all at `time` or each at its own of `times`. The keys are in canonical order; the strings (names,
    kind, time, ids, hex) are checked already to need no escaping and hold no "%"; the ints (attempt,
    seq, steps) are ints, not bools."""
    at = "%s" if times is not None else time
    rest = (f',"kind":"{kind}","payload":%s,"prev_hash":"%s","producer":"{producer}","run_id":"{run_id}",'
            f'"schema_version":{SCHEMA_VERSION},"seq":%d,"step":%s,"time":"{at}"}}').encode()
    head = f'{{"attempt":{attempt},"event_id":"{run_id}:{producer}:{attempt}:'.encode()
    sha256 = hashlib.sha256
    prev = prev_hash.encode()
    hashes, texts = [], []
    for n, (s, step, payload_text) in enumerate(zip(range(seq, seq + len(steps)), steps, payload_texts)):
        start = b'%s%d"' % (head, s)
        if times is None:
            tail = rest % (payload_text, prev, s, b"null" if step is None else b"%d" % step)
        else:
            tail = rest % (payload_text, prev, s, b"null" if step is None else b"%d" % step, times[n].encode())
        digest = sha256(start + tail).hexdigest()
        hashes.append(digest)
        prev = digest.encode()
        texts.append(b'%s,"hash":"%s"%s' % (start, prev, tail))
    return hashes, texts

