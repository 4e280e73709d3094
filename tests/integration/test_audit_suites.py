"""Provenance and forecast audits, a resumed run through the health checks, and `runledger audit`."""

from __future__ import annotations

from runledger.queries import audit
from support.audits import suites_root  # noqa: F401 (fixtures)


def test_each_query_runs_alone_over_the_plain_views_and_agrees_with_the_runner(suites_root):
    from runledger import queries

    con = queries.connect(suites_root)  # no helpers materialised: the files read the views of views.sql
    for suite in audit.SUITES:
        ran = {r.name: sorted(r.rows, key=repr) for r in audit.run_suite(suites_root, suite).results}
        for name in audit.query_names(suite):
            queries.check_read_only(con, queries.load_query(name))
            alone = sorted(con.execute(queries.load_query(name)).fetchall(), key=repr)
            assert alone == ran[name], name
