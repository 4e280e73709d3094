"""A run named by a person: its id, or its display name where one run has it (views.sql's `run_of`, the
one rule, which every command that takes a RUN and the dashboard ask through `resolve_run`); and the
runs of one name in one project, which `runledger.init(name=, resume=True)` goes on with.

A run's id is unique and wins; a name is a label any number of runs may share (`runledger.init` gives
each a fresh id), so a name that several runs have is refused with their ids, projects and starts.
A run stored before names were kept has its id as its name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from runledger.ledger.contract.events import NAME_RE
from runledger.ledger.storage import paths
from runledger.ledger.storage.paths import event_files

if TYPE_CHECKING:  # (DuckDB is loaded when a name is looked up, not when `runledger.init` imports `slug`)
    import duckdb


class AmbiguousRun(ValueError):
    """A name that several runs have; the message lists them (id, project, start) on one line."""


def resolve_run(root: str | Path, run: str, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """The id of the run `run` names under `root`: `run` itself if a run has that id, else the id of
    the one run named `run`, else `run` (no such run: the caller says so as it always did). Raises
    AmbiguousRun where several runs have the name. `con`: a connection with the views already (the
    dashboard's), else one is opened for the question."""
    if con is None:
        if not paths.is_tables(Path(root)):
            return run  # nothing stored (the command says so)
        if NAME_RE.fullmatch(run) and event_files(Path(root), run_id=run):  # an id (the files say, no query)
            return run
        from runledger import queries

        con = queries.connect(root, uses="select run_of(x)")
        try:
            return _run_of(con, run)
        finally:
            con.close()
    return _run_of(con, run)


def _run_of(con: duckdb.DuckDBPyConnection, run: str) -> str:
    import duckdb

    try:
        return con.execute("select run_of($run)", {"run": run}).fetchone()[0]
    except duckdb.InvalidInputException as err:  # views.sql's error(): the names and their runs, one line
        raise AmbiguousRun(str(err).removeprefix("Invalid Input Error: ").splitlines()[0]) from None


def slug(name: str) -> str:
    """A name as the run id `runledger.init` gave it before names were kept ("My Run 3" -> "my-run-3"), and
    the readable part of the ids it gives now; "" where no letter or digit is left."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")[:64]


def runs_named(root: str | Path, name: str, project: str | None) -> list[str]:
    """The ids of the runs under `root` named `name` in `project` (None: the runs without one), oldest
    first; a run stored before names were kept counts when its id is `slug(name)`, the id it was given."""
    root = Path(root)
    if not paths.is_tables(root):
        return []
    from runledger import queries

    con = queries.connect(root, uses="select run_names")
    try:
        rows = con.execute("select run_id from run_names where project is not distinct from $project "
                           "and (name = $name or (run_id = $slug and name = run_id)) order by started_at, run_id",
                           {"project": project, "name": name, "slug": slug(name)}).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]
