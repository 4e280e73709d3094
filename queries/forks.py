"""Where a fork or a rewind starts, read from the ledger: `parse_point` reads a parent named as W&B's
"RUN?_step=N" or the trainer's "RUN@STEP"; `fork_point(root, run, step)` finds that point of the run's
history (its spliced `steps`, so a fork of a fork reads through to the grandparent) and returns what
`run_started.parent` (a fork) or `run_started.rewind` (a rewind) records: the run, the step, the attempt,
the ledger position (`stream_seq`, `event_id`, `hash`) of the run's last step at or before it, and its
newest checkpoint there when it saved one (`runledger.ledger.contract.events.ForkedFrom`).

`runledger.init(fork_from=..., resume_from=...)` and `runledger train --fork-from` both come here, so the
two give the same `parent` for the same point. Bad input is a `ForkRefused` with a one-line reason: a
parent that does not exist, a step past its last (its future, not in the ledger yet), a rewind of a
fork to before its fork point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from runledger import queries
from runledger.ledger.contract.events import INT64_MAX, NAME_RE
from runledger.ledger.storage import paths
from runledger.queries.columns import kind_columns
from runledger.queries.names import resolve_run

FORM = "RUN?_step=N or RUN@STEP"
_POINT = re.compile(r"(?P<run>[^?@]*)(?:\?_step=(?P<w>[0-9]{1,19})|@(?P<t>[0-9]{1,19}))")
MAX_DEPTH = 64  # forks of forks followed back at most this far (views.sql's fork_lines bounds it alike)
HISTORY_KINDS = ("run_started", "step", "metrics", "checkpoint")  # what `steps` and the checkpoints read


class ForkRefused(ValueError):
    """A fork or a rewind that cannot start; the message is the one-line reason."""


@dataclass(frozen=True)
class Point:
    """A step of a run's history, as a user names it."""

    run_id: str
    step: int


def parse_point(text: object) -> Point:
    """ "RUN?_step=N" (W&B's `fork_from`/`resume_from`) or "RUN@STEP" (`runledger train --fork-from`)."""
    shown = repr(str(text))[:80]
    m = _POINT.fullmatch(str(text).strip()) if isinstance(text, str) else None
    if m is None or not NAME_RE.fullmatch(m["run"]):
        raise ForkRefused(f"{shown}: name a point of a run as {FORM} (a run id and a step >= 0)")
    step = int(m["w"] or m["t"])
    if step > INT64_MAX:
        raise ForkRefused(f"{shown}: step {step} is past any run's steps")
    return Point(m["run"], step)


def lineage(root: Path, run_id: str, con=None) -> list[str]:
    """The run and the runs its history forks from, nearest first (from their run_started files only):
    [] where the ledger has no run_started of `run_id`."""
    look = con or queries.open_connection()
    at = paths.cut(root) if paths.is_tables(root) else None
    line: list[str] = []
    try:
        while run_id not in line and len(line) < MAX_DEPTH:
            files = paths.event_files(root, "run_started", run_id, at=at) if at is not None else []
            if not files:
                break
            line.append(run_id)
            row = look.execute(
                "select parent ->> 'run_id' from "
                f"{queries.scan_files(files, kind_columns('run_started'))} where parent is not null "
                "order by attempt, seq limit 1").fetchone()
            if row is None or not row[0]:
                break
            run_id = row[0]
    finally:
        if con is None:
            look.close()
    return line


def history_files(root: Path, runs: list[str], kinds: tuple[str, ...] = HISTORY_KINDS) -> dict[str, list[Path]]:
    """kind -> the files of `runs` a spliced history reads."""
    at = paths.cut(root)
    return {kind: [f for r in runs for f in paths.event_files(root, kind, r, at=at)] for kind in kinds}


def fork_point(root: str | Path, run_id: str, step: int, rewind: bool = False) -> dict:
    """What run_started records of a fork of `run_id` at `step` (or, `rewind`, of a rewind of the run to
    `step`): a `ForkedFrom` payload. Raises ForkRefused (one line) where there is no such point."""
    root = Path(root)
    con = queries.open_connection()
    try:
        runs = lineage(root, run_id, con)
        if not runs:
            raise ForkRefused(f"no run {run_id!r} under {root}: nothing to {'rewind' if rewind else 'fork'}")
        queries.connect(root, files=history_files(root, runs), con=con, uses="steps forks checkpoints")
        last = con.execute("select max(step) from steps where run_id = ?", [run_id]).fetchone()[0]
        if last is None:
            raise ForkRefused(f"run {run_id!r} has logged no step (a loss) to {'rewind to' if rewind else 'fork from'}")
        if step > last:
            raise ForkRefused(f"run {run_id!r} has steps up to {last}: step {step} is past its last (not in the ledger yet)")
        forked = con.execute("select fork_step, parent_run from forks where run_id = ? and how = 'fork' "
                             "order by attempt limit 1", [run_id]).fetchone()
        if rewind and forked is not None and step < forked[0]:
            raise ForkRefused(f"run {run_id!r} was forked from {forked[1]!r} at step {forked[0]}: rewind it to a step "
                              f">= {forked[0]}, or fork {forked[1]!r} at step {step}")
        attempt, stream_seq, event_id, digest = con.execute(
            "select attempt, stream_seq, event_id, hash from steps where run_id = ? and step <= ? "
            "order by step desc limit 1", [run_id, step]).fetchone() or (None, None, None, None)
        saved = con.execute("select path, content_hash from checkpoints where run_id = ? and step <= ? "
                            "order by step desc, stream_seq desc limit 1", [run_id, step]).fetchone()
    finally:
        con.close()
    point = {"run_id": run_id, "step": int(step), "attempt": attempt, "stream_seq": stream_seq, "event_id": event_id,
             "hash": digest}
    if saved is not None:
        point["path"], point["content_hash"] = saved
    return {k: v for k, v in point.items() if v is not None}


def start_of(root: str | Path, given: dict, run_id: str | None, resume, resolve: bool = True):
    """What `runledger.init` starts, given its `fork_from` / `resume_from` (in `given`), `id` and `resume`:
    (the run_started field, "parent" or "rewind"; its ForkedFrom payload, the point alone unless `resolve`;
    the run id; the resume mode). A fork is a new run (its id given or made by init); a rewind is the named
    run's next attempt. RUN is a run's id, else its name where one run has it."""
    fork, rewind = given.get("fork_from"), given.get("resume_from")
    if fork and rewind:
        raise ForkRefused("fork_from and resume_from exclude each other: fork_from starts a new run, resume_from "
                          "rewinds one")
    point = parse_point(fork or rewind)
    if fork:
        if resume not in (None, False, "never"):
            raise ForkRefused(f"fork_from starts a new run: resume={resume!r} does not go with it (resume_from= "
                              "rewinds a run)")
        if run_id is not None and str(run_id) == point.run_id:
            raise ForkRefused(f"run {point.run_id!r} cannot fork from itself: resume_from={fork!r} rewinds it")
    elif run_id is not None and str(run_id) != point.run_id:
        raise ForkRefused(f"resume_from={rewind!r} rewinds run {point.run_id!r}, not id={run_id!r}: give that id or none")
    else:
        run_id, resume = point.run_id, "must"
    if not resolve:
        return ("parent" if fork else "rewind"), {"run_id": point.run_id, "step": point.step}, run_id, resume
    named = resolve_run(root, point.run_id)  # an id, else the one run of that name (as every command takes a RUN)
    if rewind and run_id == point.run_id:
        run_id = named
    return ("parent" if fork else "rewind"), fork_point(root, named, point.step, rewind=not fork), run_id, resume


def checkpoint_point(root: str | Path, run_id: str, step: int, path: str, content_hash: str) -> dict:
    """The `parent` of the trainer's fork (`runledger train --fork-from RUN@STEP`) from the parent's checkpoint
    saved at `step`: `fork_point` there, the checkpoint the one restored. The same dict as `runledger.init`'s
    `fork_from="RUN?_step=STEP"` records, so the two paths name a parent alike."""
    return {**fork_point(root, run_id, step), "run_id": run_id, "step": int(step), "path": path, "content_hash": content_hash}
