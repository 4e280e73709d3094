"""Replay: a run's state at any point, rebuilt by a pure fold of its events in stream order.

`replay(events)` folds envelopes (dicts with a parsed `payload`) into a `RunState`; `replay_run(root,
run_id, as_of_seq)` reads them from the ledger first. `apply(state, event)` is the single step of the
fold: no I/O, so agents, the worker (on resume) and the audit all see the same state.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow.compute as pc

from ledger import decision_state, store


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
    open_alerts: dict[str, dict] = field(default_factory=dict)
    _tokens_by_step: dict[int, int] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("_tokens_by_step")
        out["attempts"] = {str(k): v for k, v in self.attempts.items()}
        return out


def _run_started(s: RunState, e: dict, p: dict) -> None:
    s.status = "running"
    s.token_budget = p["token_budget"]
    s.config_hash = p["config_hash"]
    s.schedule = dict(p.get("schedule") or {})
    s.attempts[e["attempt"]] = {
        "producer": e["producer"], "first_step": e["step"], "time": e["time"],
        "code_commit": p.get("code_commit"), "config_hash": p["config_hash"],
        "resumed_from": p.get("resumed_from"), "parent": p.get("parent"),
    }
    resumed = p.get("resumed_from") or {}
    if "step" in resumed:  # steps after the checkpoint will be done again: their tokens no longer count
        for st in [st for st in s._tokens_by_step if st > resumed["step"]]:
            s.tokens_seen -= s._tokens_by_step.pop(st)


def _step(s: RunState, e: dict, p: dict) -> None:
    st = e["step"]
    s.step = st
    s.tokens_seen += p["tokens"] - s._tokens_by_step.get(st, 0)
    s._tokens_by_step[st] = p["tokens"]
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
    if p.get("state", "open") == "open":
        s.open_alerts[p["alert_id"]] = {"agent": p["agent"], "rule": p["rule"], "severity": p.get("severity", "warn"),
                                        "message": p["message"], "step": e["step"]}
    else:
        s.open_alerts.pop(p["alert_id"], None)


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


_FOLD = {
    "run_started": _run_started, "step": _step, "drops": _drops, "eval": _eval, "checkpoint": _checkpoint,
    "alert": _alert, "decision": _decision, "decision_applied": _decision_applied, "run_finished": _run_finished,
}


def apply(state: RunState, event: dict) -> RunState:
    """One step of the fold: `event` is an envelope dict whose `payload` is a parsed dict."""
    state.events += 1
    state.last_stream_seq = event.get("stream_seq") or state.last_stream_seq
    fold = _FOLD.get(event["kind"])
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


def run_events(root: str | Path, run_id: str, as_of_seq: int | None = None, full: bool = False) -> list[dict]:
    """The run's stored events in stream order, payloads parsed (up to stream_seq `as_of_seq`).

    Unless `full`, the payloads of `step` and `drops` events hold only the fields the fold reads.
    """
    per_kind = []
    for kind in sorted({p.parent.parent.name.removeprefix("kind=") for p in store.event_files(root, run_id=run_id)}):
        typed = None if full else FOLD_FIELDS.get(kind)
        table = store.read_events(root, kind, run_id, columns=ENVELOPE + (list(typed) if typed else ["payload"]))
        if as_of_seq is not None:
            table = table.filter(pc.less_equal(table["stream_seq"], as_of_seq))
        rows = table.sort_by("stream_seq").to_pylist()
        if typed:
            for r in rows:
                r["payload"] = {f: r.pop(f) for f in typed}
        else:
            loads = json.loads
            for r in rows:
                r["payload"] = loads(r["payload"])
        per_kind.append(rows)
    return list(heapq.merge(*per_kind, key=lambda r: r["stream_seq"]))


def replay_run(root: str | Path, run_id: str, as_of_seq: int | None = None) -> RunState:
    return replay(run_id, run_events(root, run_id, as_of_seq))


def to_json_text(state: RunState) -> str:
    def default(o: Any) -> Any:
        raise TypeError(f"not JSON: {type(o).__name__}")

    return json.dumps(state.to_json(), indent=2, sort_keys=True, default=default)
