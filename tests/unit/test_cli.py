"""The `runledger` command as a user runs it: read-only SQL, publish, a local NATS server, replay errors.

In this process (`cli`) unless the process is what is tested (`runledger`): a server left running,
bytes on stdin, what a command's start-up imports."""

from __future__ import annotations

import csv
import io
import json
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runledger.tools.cli import main
from support import REPO
from support.processes import cli
from support.properties import examples
from support.runs import ledger_root  # noqa: F401 (fixtures)


def sql(root: Path, query: str, fmt: str = "table"):
    return cli("sql", "--root", str(root), "--format", fmt, query)


def test_sql_formats(ledger_root):
    q = "select step, attempt, loss from steps where step >= 8 order by step"
    r = sql(ledger_root, q, "csv")
    assert r.returncode == 0, r.stderr
    assert list(csv.reader(io.StringIO(r.stdout))) == [["step", "attempt", "loss"], ["8", "1", "3.0"], ["9", "1", "3.0"]]

    r = sql(ledger_root, q, "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"step": 8, "attempt": 1, "loss": 3.0}, {"step": 9, "attempt": 1, "loss": 3.0}]

    r = sql(ledger_root, "select count(*) as n_steps, count(distinct step) as distinct_steps from steps", "table")
    assert r.returncode == 0, r.stderr
    assert "n_steps" in r.stdout and "10" in r.stdout


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40), min_size=1, max_size=12),
       st.lists(st.lists(st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=30),
                                  st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30)),
                        min_size=12, max_size=12),
                max_size=5))
def test_sql_tables_are_drawn_as_rich_draws_them(names, values):
    """`runledger sql`'s table is drawn without rich where the text is the same (a small query's start skips
    rich's import): exactly rich's output; elsewhere (wider than the line, text beyond printable ASCII) rich's."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from runledger.tools.cli import plain_table, visible

    cells = [[visible(c) for c in names]] + [["" if v is None else visible(str(v)) for v in r[:len(names)]] for r in values]
    width = max(120, min(250, 20 * len(names)))
    out = io.StringIO()
    t = Table(show_lines=False)
    for c in cells[0]:
        t.add_column(Text(c))
    for r in cells[1:]:
        t.add_row(*(Text(v) for v in r))
    Console(width=width, file=out).print(t)
    drawn = plain_table(cells, width)
    assert drawn is None or drawn == out.getvalue()
    if all(v.isascii() and v.isprintable() for r in cells for v in r) and len(out.getvalue().splitlines()[0]) < width:
        assert drawn is not None  # (the common case is drawn: this test would pass on a plain_table of None only)


def test_sql_error_is_bad_input(ledger_root):
    r = sql(ledger_root, "select no_such_column from steps")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("runledger sql: SQL error:"), r.stderr


def files_under(*dirs: Path) -> set[Path]:
    return {p for d in dirs for p in d.rglob("*")} if dirs else set()


WRITES = [
    "COPY (select * from steps) TO '{name}.csv'",  # relative: the current directory
    "COPY (select * from steps) TO '{root}/{name}.parquet' (FORMAT parquet)",
    "CREATE TABLE {name} AS select * from steps",
    "ATTACH '{root}/{name}.duckdb' AS db2",
    "INSTALL httpfs",
    "SET threads = 1",
    "EXPORT DATABASE '{root}/{name}'",
    "select count(*) from steps; COPY (select 1) TO '{root}/{name}.csv'",
]


@pytest.mark.parametrize("statement", WRITES)
def test_sql_refuses_writes(ledger_root, statement, capsys, monkeypatch):
    """In-process (the same `main` the console script runs), to keep the suite fast; cwd is the repo."""
    monkeypatch.chdir(REPO)
    name = f"leak_{uuid.uuid4().hex[:8]}"
    before = files_under(ledger_root)
    rc = main(["sql", "--root", str(ledger_root), statement.format(name=name, root=ledger_root)])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert err.count("\n") == 1 and "runledger sql:" in err and "only queries" in err, err
    assert out == ""  # not even the select before the write ran
    assert files_under(ledger_root) == before
    assert not list(REPO.glob(f"{name}*")) and not list(Path.cwd().glob(f"{name}*"))


def test_sql_cannot_read_outside_the_root(ledger_root, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    r = sql(ledger_root, f"select * from read_csv('{secret}')")
    assert r.returncode == 2 and "secret" not in r.stdout, r.stdout


def test_replay_of_an_unknown_run_is_bad_input(ledger_root):
    r = cli("replay", "no-such-run", "--root", str(ledger_root))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "no events for run 'no-such-run'" in r.stderr, r.stderr
    r = cli("replay", "../x", "--root", str(ledger_root))  # neither an id nor a stored run's name
    assert r.returncode == 2 and "no run has the id or name '../x'" in r.stderr, r.stderr
