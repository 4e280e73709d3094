"""The rule book: every threshold the SQL or an agent reads is in queries/thresholds.py, once, with its
readers; a run's run_started.thresholds override it for the audit and the agents alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runledger import queries  # noqa: E402
from runledger.agents.runner import run_thresholds  # noqa: E402
from runledger.queries.thresholds import DEFAULTS, RULE_BOOK, THRESHOLDS  # noqa: E402
from runledger.training.schedule import make_schedule  # noqa: E402
from support import REPO
from support.audit_ledger import T0, Ledger  # noqa: E402

SQL_READ = re.compile(r"\bname\s*=\s*'([a-z0-9_]+)'")  # ... from run_thresholds where name = 'X'
AGENT_READ = re.compile(r"""\bth\[\s*["']([a-z0-9_]+)["']\s*\]""")  # th["X"] in an agent
VIEW = re.compile(r"^create or replace (?:view|macro) (\w+)", re.MULTILINE)


def readers() -> dict[str, set[str]]:
    """threshold name -> who reads it, found in the sources: health/X (a check), evidence/X,
    forecast/X, views/X (a view of views.sql), agents/X (an agent's module)."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "queries").rglob("*.sql")):
        text = path.read_text()
        if path.name == "views.sql":  # each statement is one view, named for it
            starts = [(m.start(), m.group(1)) for m in VIEW.finditer(text)]
            for (at, view), (end, _) in zip(starts, starts[1:] + [(len(text), "")]):
                for name in SQL_READ.findall(text[at:end]):
                    found.setdefault(name, set()).add(f"views/{view}")
            continue
        for name in SQL_READ.findall(text):
            found.setdefault(name, set()).add(f"{path.parent.name}/{path.stem}")
    for path in sorted((REPO / "agents").glob("*.py")):
        for name in AGENT_READ.findall(path.read_text()):
            found.setdefault(name, set()).add(f"agents/{path.stem}")
    return found


def test_every_threshold_read_is_in_the_rule_book_with_its_readers():
    found = readers()
    assert found, "no threshold read found: the patterns no longer match the sources"
    missing = sorted(set(found) - set(THRESHOLDS))
    assert not missing, f"read but not in queries/thresholds.py: {missing}"
    for t in RULE_BOOK:
        assert set(t.read_by) == found.get(t.name, set()), (t.name, t.read_by, found.get(t.name))


def test_each_threshold_has_one_default():
    names = [t.name for t in RULE_BOOK]
    assert len(names) == len(set(names)), "a threshold is defined twice in the rule book"
    former = [t.formerly for t in RULE_BOOK if t.formerly]
    assert not set(former) & set(names), "a former name is also a threshold's name"
    for t in RULE_BOOK:
        assert isinstance(t.default, float) and t.unit and t.anchor and t.read_by, t
    # no second default anywhere: views.sql takes its defaults from the rule book, and no agent,
    # query or training module writes a threshold name beside a number
    assert "{{threshold_defaults}}" in (REPO / "queries" / "views.sql").read_text()
    literal = re.compile(r"""["'](%s)["']\s*[:,]\s*-?[\d.]""" % "|".join(names + former))
    for folder, pattern in (("queries", "**/*.sql"), ("agents", "*.py"), ("queries", "*.py"), ("training", "*.py"),
                            ("ledger", "*.py")):
        for path in (REPO / folder).glob(pattern):
            if path.name == "thresholds.py":
                continue
            second = literal.search(path.read_text())
            assert not second, f"{path.relative_to(REPO)} writes a default: {second and second[0]}"


@pytest.fixture(scope="module")
def overridden(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("thresholds") / "ledger"
    led = Ledger(root)
    start = {"config": {}, "config_hash": "0" * 64, "token_budget": 1000, "tokens_per_step": 10,
             "schedule": make_schedule(1e-3, 10, 100, 0.05, tokens_per_step=10)}
    for run_id, thresholds in (("plain", None), ("strict", {"grad_norm_max": 0.5}),
                               ("old-name", {"window_steps": 3}),
                               ("both-names", {"window_steps": 3, "block_steps": 7})):
        led.emit(run_id, "run_started", {**start, **({"thresholds": thresholds} if thresholds else {})}, 0, T0)
    led.write()
    return root


def test_the_audit_and_the_agents_read_the_same_thresholds_and_a_run_overrides_them(overridden):
    con = queries.connect(overridden)
    audit = {(r, n): v for r, n, v in con.execute("select run_id, name, value from run_thresholds").fetchall()}
    defaults = dict(con.execute("select name, value::double from threshold_defaults").fetchall())
    assert defaults == DEFAULTS
    for run_id in ("plain", "strict", "old-name", "both-names"):
        agents = run_thresholds(con, run_id)
        assert agents == {n: audit[(run_id, n)] for n in THRESHOLDS}
    assert run_thresholds(con, "plain") == DEFAULTS
    assert run_thresholds(con, "strict")["grad_norm_max"] == 0.5
    old = run_thresholds(con, "old-name")  # the former window_steps still sets both of its meanings
    assert old["block_steps"] == 3 and old["agent_window_steps"] == 3
    both = run_thresholds(con, "both-names")  # the new name wins over the former one
    assert both["block_steps"] == 7 and both["agent_window_steps"] == 3
    source = dict(con.execute("select name, source from run_thresholds where run_id = 'strict'").fetchall())
    assert source["grad_norm_max"] == "run_started.thresholds"
    assert source["drop_fraction_max"] == THRESHOLDS["drop_fraction_max"].anchor
