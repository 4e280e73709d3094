"""Where a run starts, decided over the ledger: `resume_point` (the last checkpoint and the schedule in
force, as attempt+1) and `fork_point` (a parent's checkpoint at or before a step). Checkpoints of
a run live under `ckpt_dir(root, run_id)`.
"""

from __future__ import annotations

from pathlib import Path

from runledger.ledger.check.replay import replay_run, run_events
from runledger.ledger.contract import decision_state
from runledger.queries import forks
from runledger.training import checkpoint
from runledger.training.worker import Start


def ckpt_dir(root: str | Path, run_id: str) -> Path:
    return Path(root) / "checkpoints" / run_id


def resume_point(root: str | Path, run_id: str) -> tuple[Start, str | None]:
    """Where a resumed run goes on: (Start as attempt+1, the run's recorded config hash).

    The ledger's replay gives the last checkpoint, the schedule in force and the attempts so far;
    without ledger events (emission was off) the newest local checkpoint is used instead.
    """
    try:
        state = replay_run(root, run_id)
    except (FileNotFoundError, OSError, ValueError):
        state = None
    attempts = state.attempts if state is not None else {}
    attempt = max(attempts) + 1 if attempts else 1
    first_hash = attempts[min(attempts)]["config_hash"] if attempts else None  # before any decision
    ckpt = state.last_checkpoint if state is not None else None
    if ckpt is None:
        ckpt = checkpoint.latest(ckpt_dir(root, run_id))
    if ckpt is None:
        return Start(attempt=attempt, schedule=(state.schedule or None) if state else None), first_hash
    meta = checkpoint.read_meta(ckpt["path"])
    schedule = (state.schedule if state is not None and state.schedule else None) or meta.get("schedule")
    dispatch = (state.dispatch if state is not None and state.dispatch else None) or meta.get("dispatch")
    return (Start(attempt=attempt, checkpoint_path=ckpt["path"], step=int(ckpt["step"]), schedule=schedule,
                  content_hash=ckpt["content_hash"], dispatch=dispatch,
                  extension_holds=extension_holds(state.decisions if state is not None else {})),
            first_hash or meta.get("config_hash"))


def extension_holds(decisions: dict[str, dict]) -> tuple[tuple[int, bool], ...]:
    """The context extension's holds and releases the worker applied, as (step, held) in step order: a resumed
    attempt goes on with them where its past did (they are answered, and the agent sees them in force)."""
    moves = [(d["applied_at_step"], d["action"] == "hold_context_extension") for d in decisions.values()
             if d.get("action") in ("hold_context_extension", "release_context_extension")
             and d.get("status") == decision_state.APPLIED and d.get("applied_at_step") is not None]
    return tuple(sorted(moves, key=lambda m: m[0]))


def fork_point(root: str | Path, parent_run: str, at_step: int) -> Start:
    """A new run starting from `parent_run`'s newest checkpoint at or before `at_step`."""
    try:
        saved = [(e["step"], e["payload"]) for e in run_events(root, parent_run, full=True) if e["kind"] == "checkpoint"]
    except (FileNotFoundError, OSError, ValueError):
        saved = []
    saved = [(s, p) for s, p in saved if s is not None and s <= at_step]
    if saved:
        step, payload = max(reversed(saved), key=lambda sp: sp[0])  # (of two at one step, the later: as forks.fork_point)
        path, digest = payload["path"], payload["content_hash"]
    else:  # not in the ledger (emission off): the parent's local checkpoints
        meta = checkpoint.latest(ckpt_dir(root, parent_run), at_or_before=at_step)
        if meta is None:
            raise ValueError(f"run {parent_run!r} has no checkpoint at or before step {at_step}")
        step, path, digest = meta["step"], meta["path"], meta["content_hash"]
    meta = checkpoint.read_meta(path)
    parent = {"run_id": parent_run, "step": int(step), "content_hash": digest, "path": path}
    if saved:  # where in the parent's history, as `runledger.init(fork_from=)` records it
        parent = forks.checkpoint_point(root, parent_run, int(step), path, digest)
    return Start(attempt=0, checkpoint_path=path, step=int(step), schedule=meta.get("schedule"), content_hash=digest,
                 dispatch=meta.get("dispatch"), parent=parent)
