"""Replay: a run's state at any point, rebuilt by a pure fold of its events in stream order.

`replay(events)` folds envelopes (dicts with a parsed `payload`) into a `RunState`; `replay_run(root,
run_id, as_of_seq)` streams them from the ledger (`stream_events`): the run's files read a batch at a
time and merged by stream seq, each opened when the stream reaches it (its first stream seq, from its
Parquet statistics), so memory is a batch per file open at once (files written one after another are
open one at a time), and `as_of_seq` stops the reading there.
`apply(state, event)` is the single step of the fold: no I/O, so agents, the worker (on resume) and
the audit all see the same state.
"""

from __future__ import annotations

import bisect
import heapq
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runledger.ledger.contract import decision_state
from runledger.ledger.storage import paths, streams
from runledger.ledger.storage.reads import read_events
from runledger.ledger.contract.roles import is_person
from runledger.ledger.storage.objects import source


@dataclass
class RunState:
    """What is known about a run after some prefix of its events."""

    run_id: str
    status: str = "unknown"  # unknown | running | completed | failed | stopped
    step: int | None = None  # the last step recorded (it goes back after a resume)
    tokens_seen: int = 0  # tokens of the steps in force (a re-done step counts once, its latest)
    token_budget: int | None = None
    events: int = 0
    last_stream_seq: int = 0
    config_hash: str | None = None
    attempts: dict[int, dict] = field(default_factory=dict)
    last_checkpoint: dict | None = None
    schedule: dict = field(default_factory=dict)  # in force: initial, then as decisions moved it
    dispatch: dict = field(default_factory=dict)  # in force: dispatch mode, capacity factors
    last_loss: float | None = None
    last_eval: dict | None = None
    decisions: dict[str, dict] = field(default_factory=dict)  # decision_id -> what, and what became of it
    open_alerts: dict[tuple[str, str], dict] = field(default_factory=dict)  # (alert_id, producer) -> the alert
    _tokens_by_step: "StepTokens" = field(default_factory=lambda: StepTokens(), repr=False)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("_tokens_by_step")
        out["attempts"] = {str(k): v for k, v in self.attempts.items()}
        out["open_alerts"] = [{"alert_id": a, "producer": p, **v} for (a, p), v in sorted(self.open_alerts.items())]
        return out


class StepTokens:
    """The tokens of each step in force, as runs of consecutive steps with the same tokens: a run's
    steps take a few entries, not one each, so a replay's memory does not grow with the run."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []  # [first step, last step, tokens], sorted, not overlapping

    def put(self, step: int, tokens: int) -> int:
        """Record `step`'s tokens; return the tokens it had before (0 if none)."""
        runs = self.runs
        if runs and step == runs[-1][1] + 1 and tokens == runs[-1][2]:  # the usual case: the next step
            runs[-1][1] = step
            return 0
        i = bisect.bisect_right(runs, [step, float("inf")]) - 1  # the run starting at or before `step`
        if i >= 0 and runs[i][1] >= step:
            first, last, old = runs[i]
            runs[i:i + 1] = [r for r in ([first, step - 1, old], [step, step, tokens], [step + 1, last, old]) if r[0] <= r[1]]
            return old
        runs.insert(i + 1, [step, step, tokens])
        return 0

    def put_many(self, steps: np.ndarray, tokens: np.ndarray) -> int:
        """`put` each in turn; return the sum of the tokens they had before. Steps that continue the
        last run one by one with its tokens (a run going on) take one step, not one each."""
        runs = self.runs
        if (runs and len(steps) and steps[0] == runs[-1][1] + 1 and (tokens == runs[-1][2]).all()
                and (np.diff(steps) == 1).all()):
            runs[-1][1] = int(steps[-1])
            return 0
        return sum(self.put(st, tk) for st, tk in zip(steps.tolist(), tokens.tolist()))

    def drop_after(self, step: int) -> int:
        """Forget the steps after `step`; return their tokens."""
        dropped = 0
        while self.runs and self.runs[-1][1] > step:
            first, last, tokens = self.runs[-1]
            keep_to = max(first - 1, step)
            dropped += (last - keep_to) * tokens
            if keep_to >= first:
                self.runs[-1][1] = keep_to
            else:
                self.runs.pop()
        return dropped


def _run_started(s: RunState, e: dict, p: dict) -> None:
    s.status = "running"
    s.token_budget = p.get("token_budget")  # optional: a run of a user's own loop plans none
    s.config_hash = p["config_hash"]
    s.schedule = dict(p.get("schedule") or {})
    s.attempts[e["attempt"]] = {
        "producer": e["producer"], "first_step": e["step"], "time": e["time"],
        "code_commit": p.get("code_commit"), "config_hash": p["config_hash"],
        "resumed_from": p.get("resumed_from"), "parent": p.get("parent"), "rewind": p.get("rewind"),
    }
    resumed = p.get("rewind") or p.get("resumed_from") or {}  # (a rewind: its steps after rewind.step no longer count)
    if "step" in resumed:  # steps after the checkpoint will be done again: their tokens no longer count
        s.tokens_seen -= s._tokens_by_step.drop_after(resumed["step"])


def _step(s: RunState, e: dict, p: dict) -> None:
    st = e["step"]
    s.step = st
    s.tokens_seen += p["tokens"] - s._tokens_by_step.put(st, p["tokens"])
    if p.get("loss") is not None:
        s.last_loss = p["loss"]


def _drops(s: RunState, e: dict, p: dict) -> None:
    s.dispatch["dispatch"] = p["dispatch"]
    for k in ("cf_send", "cf_recv", "seq_len"):
        if p.get(k) is not None:
            s.dispatch[k] = p[k]


def _eval(s: RunState, e: dict, p: dict) -> None:
    s.last_eval = {"step": e["step"], "loss": p["loss"], "domain_losses": p.get("domain_losses", {})}


def _checkpoint(s: RunState, e: dict, p: dict) -> None:
    s.last_checkpoint = {"step": e["step"], "path": p["path"], "content_hash": p["content_hash"],
                         "attempt": e["attempt"], "tokens_seen": p.get("tokens_seen")}


def _alert(s: RunState, e: dict, p: dict) -> None:
    """An alert is its producer's: raised and resolved by (alert_id, producer), so that no one else's
    event with the same alert_id closes or rewrites it; a person (roles.is_person) resolves any."""
    key = (p["alert_id"], e["producer"])
    if p.get("state", "open") == "open":
        s.open_alerts[key] = {"agent": p["agent"], "rule": p["rule"], "severity": p.get("severity", "warn"),
                              "message": p["message"], "step": e["step"]}
    elif is_person(e["producer"]):
        for k in [k for k in s.open_alerts if k[0] == p["alert_id"]]:
            del s.open_alerts[k]
    else:
        s.open_alerts.pop(key, None)


def _decision(s: RunState, e: dict, p: dict) -> None:
    decision_state.fold_decision(s.decisions, p, e["step"])


def _decision_applied(s: RunState, e: dict, p: dict) -> None:
    d = decision_state.fold_applied(s.decisions, p, e["step"])
    if d["status"] != decision_state.APPLIED:
        return
    after = p.get("after") or {}
    if p["action"] == "set_token_horizon":
        s.schedule.update(after)
    elif p["action"] in ("set_dispatch", "set_capacity_factor"):
        s.dispatch.update(after)


def _run_finished(s: RunState, e: dict, p: dict) -> None:
    s.status = p["status"]


# kind -> how an event of that kind moves the run's state (a kind not named leaves it)
FOLD = {
    "run_started": _run_started, "step": _step, "drops": _drops, "eval": _eval, "checkpoint": _checkpoint,
    "alert": _alert, "decision": _decision, "decision_applied": _decision_applied, "run_finished": _run_finished,
}


def apply(state: RunState, event: dict) -> RunState:
    """One step of the fold: `event` is an envelope dict whose `payload` is a parsed dict."""
    state.events += 1
    state.last_stream_seq = event.get("stream_seq") or state.last_stream_seq
    fold = FOLD.get(event["kind"])
    if fold is not None:
        fold(state, event, event["payload"])
    return state


def replay(run_id: str, events: Iterable[dict]) -> RunState:
    state = RunState(run_id)
    for e in events:
        apply(state, e)
    return state


# The payload fields the fold reads, for the kinds that are most of a run: replay reads these typed
# columns instead of parsing every payload's JSON (5x faster on a million events).
FOLD_FIELDS = {"step": ("tokens", "loss"), "drops": ("dispatch", "cf_send", "cf_recv", "seq_len")}
ENVELOPE = ["event_id", "run_id", "producer", "attempt", "seq", "kind", "time", "step", "stream_seq"]
BATCH_ROWS = 65_536  # rows read at once from a file: the steps among them are folded as arrays, so larger is faster


def run_events(root: str | Path, run_id: str, as_of_seq: int | None = None, full: bool = False) -> list[dict]:
    """The run's stored events in stream order, payloads parsed (up to stream_seq `as_of_seq`).

    Unless `full`, the payloads of `step` and `drops` events hold only the fields the fold reads.
    """
    per_kind = []
    for kind in sorted({p.parent.parent.name.removeprefix("kind=") for p in paths.event_files(root, run_id=run_id)}):
        typed = None if full else FOLD_FIELDS.get(kind)
        table = read_events(root, kind, run_id, columns=ENVELOPE + (list(typed) if typed else ["payload"]))
        if as_of_seq is not None:
            table = table.filter(pc.less_equal(table["stream_seq"], as_of_seq))
        per_kind.append(_rows(table.sort_by("stream_seq").to_pylist(), typed))
    return list(heapq.merge(*per_kind, key=lambda r: r["stream_seq"]))


def stream_events(root: str | Path, run_id: str, as_of_seq: int | None = None) -> Iterator[dict]:
    """The run's stored events in stream order (up to stream_seq `as_of_seq`), as `run_events` gives
    them, with a batch per file in memory at a time (see `segments`)."""
    for kind, batch in segments(root, run_id, as_of_seq):
        yield from _rows(batch.to_pylist(), FOLD_FIELDS.get(kind))


def segments(root: str | Path, run_id: str, as_of_seq: int | None = None,
             snapshot: int | None = None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The run's stored events in stream order, as (kind, rows of that kind next in stream order): the
    files read a batch at a time (a file the ledger wrote is in stream order; one that is not is sorted
    whole) and merged by stream seq. Reading stops after `as_of_seq`. `snapshot`: ledger snapshot N
    (see `runledger.ledger.storage.paths.Cut`), else the current one."""
    at = paths.cut(Path(root), snapshot) if snapshot is not None else None
    # (stream seq of the next row, file number, kind, its batch, the batch's stream seqs, the next row, its
    # batches); a file not opened yet has no batch, its first stream seq (statistics) first, its path last
    heads: list[tuple] = []
    for i, path in enumerate(paths.event_files(root, run_id=run_id, at=at)):
        heads.append((streams.first_stream_seq(path), i, path.parent.parent.name.removeprefix("kind="), None, None, 0, path))
    heapq.heapify(heads)
    while heads:
        first, i, kind, batch, seqs, row, batches = heapq.heappop(heads)
        if batch is None:  # the stream has come to a file: open it now (the files done with are closed)
            if as_of_seq is None or first <= as_of_seq:  # (a file wholly after as_of_seq is never opened)
                typed = FOLD_FIELDS.get(kind)
                _push(heads, i, kind, _file_batches(batches, ENVELOPE + (list(typed) if typed else ["payload"]), as_of_seq))
            continue
        end = len(seqs) if not heads else max(row + 1, int(np.searchsorted(seqs, heads[0][0], side="left")))
        yield kind, batch.slice(row, end - row)
        if end < len(seqs):
            heapq.heappush(heads, (int(seqs[end]), i, kind, batch, seqs, end, batches))
        else:
            _push(heads, i, kind, batches)


def _push(heads: list, i: int, kind: str, batches: Iterator[pa.RecordBatch]) -> None:
    for batch in batches:
        if batch.num_rows:
            seqs = batch.column("stream_seq").to_numpy()
            heapq.heappush(heads, (int(seqs[0]), i, kind, batch, seqs, 0, batches))
            return


def _file_batches(path: Path, columns: list[str], as_of_seq: int | None) -> Iterator[pa.RecordBatch]:
    if _in_stream_order(path):
        batches = _open(path).iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False)
    else:
        batches = pq.read_table(source(path), columns=columns).sort_by("stream_seq").to_batches(BATCH_ROWS)
    for batch in batches:
        seqs = batch.column("stream_seq")
        if as_of_seq is not None and batch.num_rows and seqs[-1].as_py() > as_of_seq:
            yield batch.filter(pc.less_equal(seqs, as_of_seq))
            return  # the rest is later still
        yield batch


def _open(path: Path) -> pq.ParquetFile:
    """A file to read, or the reason it cannot be read, naming it."""
    try:
        return pq.ParquetFile(source(path))
    except (pa.ArrowException, OSError) as err:
        raise type(err)(f"{path.name}: {err}") from None


def _in_stream_order(path: Path) -> bool:
    """Whether a file's rows are in stream order (as the ledger writes them), from its stream_seq column."""
    last = None
    for batch in _open(path).iter_batches(batch_size=BATCH_ROWS * 16, columns=["stream_seq"], use_threads=False):
        seqs = batch.column(0)
        if not len(seqs):
            continue
        if (last is not None and seqs[0].as_py() < last) or pc.any(pc.less(seqs[1:], seqs[:-1])).as_py():
            return False
        last = seqs[-1].as_py()
    return True


def _rows(rows: list[dict], typed) -> list[dict]:
    if typed:
        for r in rows:
            r["payload"] = {f: r.pop(f) for f in typed}
    else:
        loads = json.loads
        for r in rows:
            r["payload"] = loads(r["payload"])
    return rows


def replay_run(root: str | Path, run_id: str, as_of_seq: int | None = None, snapshot: int | None = None) -> RunState:
    """The run's state after its events up to `as_of_seq`, streamed from the ledger (`segments`; of
    ledger snapshot `snapshot`, else the current one): the same as `replay` of `run_events`, with the
    steps, most of a run, folded a segment at a time."""
    state = RunState(run_id)
    for kind, batch in segments(root, run_id, as_of_seq, snapshot):
        if kind == "step" and not (batch.column("step").null_count or batch.column("tokens").null_count):
            _fold_steps(state, batch)
        else:
            for event in _rows(batch.to_pylist(), FOLD_FIELDS.get(kind)):
                apply(state, event)
    return state


def _fold_steps(s: RunState, batch: pa.RecordBatch) -> None:
    """`apply` of consecutive `step` events (see _step), without a dict per event."""
    steps, tokens = batch.column("step").to_numpy(), batch.column("tokens").to_numpy()
    s.tokens_seen += int(tokens.sum()) - s._tokens_by_step.put_many(steps, tokens)
    s.step = int(steps[-1])
    losses = batch.column("loss").drop_null()
    if len(losses):
        s.last_loss = losses[-1].as_py()
    s.events += batch.num_rows
    stream_seqs = batch.column("stream_seq").drop_null()
    if len(stream_seqs) and stream_seqs[-1].as_py():
        s.last_stream_seq = stream_seqs[-1].as_py()


def to_json_text(state: RunState) -> str:
    def default(o: Any) -> Any:
        raise TypeError(f"not JSON: {type(o).__name__}")

    return json.dumps(state.to_json(), indent=2, sort_keys=True, default=default)
