"""The ledger's batch check: a batch message of one chain's events, checked a column at a time.

`check_batch` accepts exactly what `runledger.ledger.contract.validation.check_envelope` accepts, event by event
(tests/{unit,integration}/test_ledger_batch.py compares the two), at a fraction of the CPU, for the plain form the
`Emitter` sends; anything else it hands back to check_envelope (it returns None).
"""

from __future__ import annotations

import hashlib
from operator import itemgetter
from typing import Any

from runledger.ledger.contract.canonical import orjson, orjson_text_is_canonical
from runledger.ledger.contract.events import (ENVELOPE_FIELDS, HASH_RE, INT64_MAX, KINDS, SCHEMA_VERSION, TIME_RE, InvalidEvent)
from runledger.ledger.contract.validation import (check_time, long_int_in, names_ok, payloads_valid, speaker_problem, steps_ok)

_COLUMN_OF = {name: itemgetter(name) for name in ENVELOPE_FIELDS}
_HASH_FIELD = len(',"hash":"') + 64 + 1  # the bytes of the hash field in an envelope's text


def check_batch(data: bytes, envs: Any, run_id: str, kind: str) -> list[str] | None:
    """The payload texts of a batch message (`data`, parsed: `envs`) whose envelopes are all valid,
    checked a column at a time; None when the batch is not in the plain form checked here (then
    check_envelope checks each envelope alone, and says why one is invalid).

    The plain form: what `Emitter` sends, 2 or more events of one chain, seqs consecutive, each
    linked to the one before (prev_hash), and `data` byte for byte the canonical text of `envs`, so
    that each event's canonical text (to hash) and payload text are slices of `data`. It accepts an
    event only where check_envelope accepts it: tests/{unit,integration}/test_ledger_batch.py compares the two.
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
        names_ok(run_id, producer) and kind in KINDS
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
    if not steps_ok(col["step"]) or speaker_problem(kind, producer, col["payload"]):
        return None
    try:
        for second in {t[:19] for t in col["time"]}:
            check_time(second + "Z")
    except InvalidEvent:
        return None
    # canonical text: orjson's, where it is sure to be RFC 8785's (see runledger.ledger.contract.canonical.fast_canonical)
    if orjson is None or not orjson_text_is_canonical(data):
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
    if (digests != col["hash"] or not payloads_valid(kind, col["payload"])
            or any(long_int_in(kind, p) for p in col["payload"])):
        return None  # (a long integer: check_envelope checks it has a float64, when it is in a float field)
    return texts

