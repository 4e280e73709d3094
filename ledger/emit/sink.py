"""One way to emit: a producer hands typed events to an `EventSink`, and never asks which one it has.

    sink.emit(CheckpointSaved(path=p, bytes=n, seconds=s, content_hash=h), step=k)

The event is a payload model of `runledger.ledger.contract.events`; its kind comes from the registry (`kind_of`). The
sinks: the NATS `Emitter` (runledger.ledger.emit.emitter: a spool and a publisher), `ParquetSink` (sealed chains
written by the ledger's own writer, for benches and importers), `ListSink` (keeps the events, for
tests) and `NullSink` (emits nothing). A payload is what its model was given (`payload_of`), so a
typed event seals to the same bytes as the dict its fields make; `emit_dict(kind, payload)` is that
dict form, and `emit_dicts` the batch one, for input that arrives as JSON.
"""

from __future__ import annotations

import itertools
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NamedTuple, Protocol, Sequence, runtime_checkable

import orjson
from pydantic import BaseModel

from runledger.ledger.contract.events import KINDS, Payload
from runledger.ledger.emit.sealing import seal, seal_many, utc_now
from runledger.ledger.contract.validation import check_exact_floats, check_payload, long_int_in

if TYPE_CHECKING:  # (ParquetSink's writer, pyarrow, is loaded when one is made: the Emitter of `init` needs none of it)
    from runledger.ledger.storage.rows import StoredEvent

KIND_OF: dict[type[Payload], str] = {model: kind for kind, model in KINDS.items()}


def kind_of(event: Payload) -> str:
    """The registry's kind of a typed event (`StepCompleted(...)` → "step")."""
    try:
        return KIND_OF[type(event)]
    except KeyError:
        raise TypeError(f"{type(event).__name__} is not an event payload model (runledger.ledger.contract.events.KINDS)") from None


_SCALARS = frozenset({str, int, float, bool, type(None)})


def payload_of(event: BaseModel) -> dict:
    """The payload dict of a typed event: the fields it was given, nested models as dicts (what
    `model_dump(exclude_unset=True)` gives, at a fraction of its cost: this is the emit hot path)."""
    given = event.__pydantic_fields_set__
    return {k: v if type(v) in _SCALARS else _plain(v) for k, v in event.__dict__.items() if k in given}


def _plain(value):
    if isinstance(value, BaseModel):
        return payload_of(value)
    if type(value) is list or type(value) is tuple:
        return [v if type(v) in _SCALARS else _plain(v) for v in value]
    if type(value) is dict:
        return {k: v if type(v) in _SCALARS else _plain(v) for k, v in value.items()}
    return value


@runtime_checkable
class EventSink(Protocol):
    """Where a producer's typed events go. `producer` names who emits (None: no chain of its own)."""

    producer: str | None

    def emit(self, event: Payload, step: int | None = None) -> str | None:
        """Record one event; return its event_id (None where the sink makes none)."""

    def emit_many(self, events: Sequence[Payload], steps: Sequence[int | None] | None = None) -> list[str]:
        """Record several events in order, the same as `emit` for each, for less CPU; each run of
        consecutive events of one kind is recorded all or none."""

    def close(self) -> bool:
        """Finish; True if every event is where this sink promises to put it."""


def runs_of_kind(events: Sequence[Payload], steps: Sequence[int | None] | None) -> Iterator[tuple[str, list, list]]:
    """(kind, payloads, steps) for each run of consecutive events of one kind."""
    steps = [None] * len(events) if steps is None else list(steps)
    if len(steps) != len(events):
        raise ValueError(f"{len(events)} events but {len(steps)} steps")
    i = 0
    for kind, group in itertools.groupby(events, kind_of):
        payloads = list(map(payload_of, group))
        yield kind, payloads, steps[i:i + len(payloads)]
        i += len(payloads)


class ChainSink:
    """A sink that seals its events into one chain (run_id, producer, attempt): consecutive seqs, each
    event's prev_hash the hash of the one before. Subclasses keep what is sealed (`_keep`, under
    `_lock`: raising there keeps nothing and leaves the chain where it was). `time=` (RFC 3339 text or
    a datetime; default: now) is when the events happened, for an importer that keeps it."""

    def __init__(self, run_id: str, producer: str, attempt: int, seq: int = 0, prev_hash: str = "") -> None:
        self.run_id, self.producer, self.attempt = run_id, producer, attempt
        self._seq, self._prev_hash = seq, prev_hash
        self._lock = threading.Lock()

    @property
    def next_seq(self) -> int:
        return self._seq

    def emit(self, event: Payload, step: int | None = None, *, time: str | datetime | None = None) -> str:
        """Seal and keep one typed event; return its event_id."""
        return self.emit_dict(kind_of(event), payload_of(event), step, time)

    def emit_many(self, events: Sequence[Payload], steps: Sequence[int | None] | None = None, *,
                  time: str | datetime | None = None) -> list[str]:
        """Seal and keep typed events in order (each run of one kind sealed at once, all or none), sharing
        one `time`; return their event_ids."""
        time = _time_text(time) or utc_now()
        return [i for kind, payloads, run_steps in runs_of_kind(events, steps)
                for i in self.emit_dicts(kind, payloads, run_steps, time)]

    def emit_dict(self, kind: str, payload: dict, step: int | None = None, time: str | datetime | None = None) -> str:
        """The dict form of `emit`: the payload validated against its kind's model here."""
        with self._lock:
            env, text = seal(self.run_id, self.producer, self.attempt, self._seq, kind, payload, step,
                             self._prev_hash, _time_text(time))
            self._keep(kind, [env["event_id"]], [env["hash"]], [text.encode()])
            self._seq, self._prev_hash = self._seq + 1, env["hash"]
        self._kept()
        return env["event_id"]

    def emit_dicts(self, kind: str, payloads: list[dict], steps: list[int | None] | None = None,
                   time: str | datetime | None = None) -> list[str]:
        """Seal and keep several events of one kind at once, in order; return their event_ids.

        For high-rate producers: the same events as `emit_dict` for each in turn (each its own event_id,
        seq and hash), sharing one `time`, at a fraction of the CPU (one validation call, one orjson
        call, one write). All or nothing: a bad payload raises InvalidEvent and keeps none.
        """
        if not payloads:
            return []
        with self._lock:
            ids, hashes, texts = seal_many(self.run_id, self.producer, self.attempt, self._seq, kind, payloads, steps,
                                           self._prev_hash, _time_text(time))
            self._keep(kind, ids, hashes, texts)
            self._seq, self._prev_hash = self._seq + len(ids), hashes[-1]
        self._kept()
        return ids

    def _keep(self, kind: str, ids: list[str], hashes: list[str], texts: list[bytes]) -> None:
        raise NotImplementedError

    def _kept(self) -> None:
        """After the lock is released (ParquetSink writes a full batch here)."""


def _time_text(at: str | datetime | None) -> str | None:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if isinstance(at, datetime) else at


class ParquetSink(ChainSink):
    """Seals one chain and writes it with the ledger's own writer (`runledger.ledger.storage.store`), as the ledger would
    have stored it: for benches, importers and tests that need a root without NATS.

    Each event gets the next of `stream_seqs` (share one counter among the sinks writing one root, so
    that stream order is emit order; default: counting on from what the root holds). Sealed events
    wait in `rows` (a list the sinks of one root may share, to write them together) until `flush()`,
    `close()` or `flush_every` of them."""

    def __init__(self, root: str | Path, run_id: str, producer: str = "worker-0", attempt: int = 0, *,
                 stream_seqs: Iterator[int] | None = None, rows: list[StoredEvent] | None = None,
                 flush_every: int | None = 100_000) -> None:
        from runledger.ledger.storage import positions, store
        from runledger.ledger.storage.rows import StoredEvent

        super().__init__(run_id, producer, attempt)
        self.root = Path(root)
        self._row, self._write = StoredEvent, store.write_events
        self.stream_seqs = stream_seqs if stream_seqs is not None else itertools.count(positions.taken_upto(self.root) + 1)
        self.rows = rows if rows is not None else []
        self.flush_every = flush_every

    def _keep(self, kind: str, ids: list[str], hashes: list[str], texts: list[bytes]) -> None:
        for text in texts:
            env = orjson.loads(text)
            # the payload's canonical text, cut from the envelope's: the fields around it are names, ids and hex
            payload_text = text[text.index(b',"payload":') + 11:text.rindex(b',"prev_hash":"')].decode()
            if long_int_in(kind, env["payload"]):
                check_exact_floats(kind, env["payload"], fix=True)  # (as the ledger stores it)
            self.rows.append(self._row(env, payload_text, next(self.stream_seqs)))

    def _kept(self) -> None:
        if self.flush_every is not None and len(self.rows) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write what is sealed and not yet written (durably: runledger.ledger.storage.store.write_events)."""
        with self._lock:
            rows = self.rows[:]
            del self.rows[:]
        if rows:
            self._write(self.root, rows)

    def close(self) -> bool:
        self.flush()
        return True

    def __enter__(self) -> "ParquetSink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Emitted(NamedTuple):
    kind: str
    step: int | None
    event: Payload


class ListSink:
    """Keeps every event in memory, in order, each checked as a sealing sink would (for tests):
    `events`, and `of(kind)` → [(step, event)]."""

    def __init__(self, producer: str | None = None) -> None:
        self.producer = producer
        self.events: list[Emitted] = []
        self.closed = False

    def emit(self, event: Payload, step: int | None = None) -> None:
        kind = kind_of(event)
        check_payload(kind, payload_of(event))  # (a model built without validation is caught here too)
        self.events.append(Emitted(kind, step, event))

    def emit_many(self, events: Sequence[Payload], steps: Sequence[int | None] | None = None) -> list[str]:
        steps = [None] * len(events) if steps is None else list(steps)
        if len(steps) != len(events):
            raise ValueError(f"{len(events)} events but {len(steps)} steps")
        for kind, payloads, _ in runs_of_kind(events, steps):  # all or none
            for payload in payloads:
                check_payload(kind, payload)
        self.events += map(Emitted, map(kind_of, events), steps, events)
        return []

    def emit_dict(self, kind: str, payload: dict, step: int | None = None) -> None:
        """The dict form of `emit`, as a sealing sink's: checked, then kept as its typed event."""
        check_payload(kind, payload)
        self.events.append(Emitted(kind, step, KINDS[kind].model_validate(payload)))

    def of(self, kind: str) -> list[tuple[int | None, Payload]]:
        return [(e.step, e.event) for e in self.events if e.kind == kind]

    def payloads(self, kind: str) -> list[tuple[int | None, dict]]:
        """[(step, payload)] of a kind, each payload the dict a sealing sink seals (`payload_of`)."""
        return [(e.step, payload_of(e.event)) for e in self.events if e.kind == kind]

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def close(self) -> bool:
        self.closed = True
        return True


class NullSink:
    """Emits nothing (a run trained without a ledger)."""

    producer: str | None = None

    def emit(self, event: Payload, step: int | None = None) -> None:
        return None

    def emit_many(self, events: Sequence[Payload], steps: Sequence[int | None] | None = None) -> list[str]:
        return []

    def emit_dict(self, kind: str, payload: dict, step: int | None = None) -> None:
        return None

    def close(self) -> bool:
        return True
