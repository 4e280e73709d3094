"""The dashboard (`runledger ui`): its access rules and its downsampling on a ledger written by the real
writer, then the whole thing in Debian's chromium: a real nats-server, a real ledger process, the UI
served by `runledger ui` on a non-loopback address with a token, and an Emitter logging while the page
is open. One browser and one server for the module.

`RUNLEDGER_UI_SCREENSHOT=docs/ui.png pytest tests/{unit,integration,e2e}/test_ui.py -k charts` also keeps the run page's
screenshot there (the README's first screen).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

from support.audit_ledger import T0, Ledger
from support.processes import LedgerProcess
from support.reading import wait_for_count
from support.runs import step_payload
from support.ui import client


def test_the_ladder_view_has_its_rungs_and_the_targets_forecast_against_its_actual(tmp_path):
    from support.audit_ledger import write_run

    led = Ledger(tmp_path / "root")
    write_run(led, "rung-a", ladder="lad")
    write_run(led, "target", ladder="lad", forecasts="hit")
    led.write()
    with client(tmp_path / "root", "127.0.0.1") as c:
        assert c.get("/api/ladders").json()["ladders"][0]["ladder"] == "lad"
        got = c.get("/api/ladder/lad").json()
        assert {r["run_id"] for r in got["rungs"]} == {"rung-a", "target"}
        [target] = got["targets"]
        assert target["target"] == "target" and target["fit"]["rungs"] == ["rung-a"]
        reached = [p for p in target["points"] if p["reached"]]
        assert reached and all(p["observed_loss"] is not None and p["inside_band"] for p in reached)


def _same_rows(got: dict, reference: list[dict]) -> None:
    """The runs page's rows (put together from each file's parts) against ui/runs.sql over the whole views."""
    assert sorted(got) == sorted(r["run_id"] for r in reference)
    for ref in reference:
        row = got[ref["run_id"]]
        for col, want in ref.items():
            have = row[col]
            if col in ("started_at", "last_event"):  # (the same instant: the zone's spelling may differ)
                have, want = datetime.fromisoformat(have), datetime.fromisoformat(want)
            if col == "config":  # (the same JSON: DuckDB's spelling of a number may differ)
                have, want = json.loads(have), json.loads(want)
            assert have == want, (ref["run_id"], col)


def test_the_runs_rows_come_from_each_files_parts_kept_across_restarts_and_equal_runs_sql(tmp_path, monkeypatch):
    from runledger.ui.data import Reader
    from runledger.ui.runs import FILE_PARTS
    from runledger.ui.snapshot import load
    from support.audit_ledger import write_run

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    led = Ledger(tmp_path / "root")
    write_run(led, "rung-a", ladder="lad")
    write_run(led, "forked", parent={"run_id": "rung-a", "step": 100, "content_hash": f"{100:064x}"})
    for i, (state, severity) in enumerate([("open", "warn"), ("open", "fail"), ("resolved", "fail")]):
        led.emit("rung-a", "alert", {"alert_id": f"a{i}", "agent": "watch", "rule": "r", "severity": severity,
                                     "state": "open", "message": "m"}, 10 + i, T0 + timedelta(seconds=i))
        led.emit("rung-a", "alert", {"alert_id": f"a{i}", "agent": "watch", "rule": "r", "severity": severity,
                                     "state": state, "message": "m"}, 20 + i, T0 + timedelta(seconds=20 + i))
    led.write()
    root = tmp_path / "root"
    first = Reader(root, threads=1)
    try:
        rows = first.summaries()
        _same_rows(rows, first.rows(load("runs")))
        assert rows["rung-a"]["alerts_warn"] == 1 and rows["rung-a"]["alerts_fail"] == 1  # (a2 was resolved)
        assert rows["forked"]["parents"] == ["rung-a"] and rows["rung-a"]["ladder"] == "lad"
    finally:
        first.close()
    # a restart: every listed file's parts come from the cache folder, before anything is read
    write_run(led, "later", first=1, last=20, finish=False)
    led.write()
    again = Reader(root, threads=1)
    try:
        kept, files = set(again.index.parts), again.run_files()  # (the kinds the runs page reads)
        listed = {str(f) for r in files.values() for kind, fs in r.items() if kind in FILE_PARTS for f in fs}
        new = {str(f) for kind, fs in files["later"].items() if kind in FILE_PARTS for f in fs}
        assert listed - new <= kept and not new & kept  # only the new run's files are still to be read
        rows = again.summaries()
        assert new <= set(again.index.parts)
        _same_rows(rows, again.rows(load("runs")))
        assert rows["later"]["finished"] is None and rows["later"]["last_step"] == 20
    finally:
        again.close()


def test_a_partitioned_roots_run_goes_live_at_its_partitions_position(tmp_path, nats_server):
    """On a root served by `ledger serve --partitions 2` there is no single position: the feed waits for
    the run's own last message to be stored by its partition's writer, and a page's points come up to
    that partition's position."""
    import asyncio

    from runledger.ledger.emit.emitter import Emitter
    from runledger.ledger.ingest import partitions
    from runledger.ui.data import Reader
    from runledger.ui.live import Feed

    root = tmp_path / "root"
    ledger = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log", "--partitions", "2").start()
    em = Emitter("r1", "worker-0", 0, nats_server.url, tmp_path / "spool")
    try:
        em.emit_dict("step", step_payload(5.0), step=0)
        assert em.flush(60)
        assert wait_for_count(root, "select count(*) from steps_all", 1) == 1

        async def follow() -> list[int]:
            reader = Reader(root)
            feed = Feed(reader, nats_server.url)
            await feed.start()
            try:
                since, seen = 0, []
                for step in range(1, 4):
                    version = feed.version
                    await asyncio.to_thread(lambda: em.emit_dict("step", step_payload(5.0 - step), step=step) or em.flush(60))
                    deadline = time.monotonic() + 30
                    while step not in seen and time.monotonic() < deadline:
                        if await feed.wait_change(version, 1.0):
                            version = feed.version
                        news = await asyncio.to_thread(reader.new_points, "r1", since)
                        since = news["seq"]
                        seen += news.get("step", {}).get("loss", {}).get("0", ([], []))[0]
                assert "" not in reader.positions and since == partitions.stored_upto(reader.positions, "r1") > 0
                return seen
            finally:
                await feed.stop()
                reader.close()

        assert asyncio.run(follow()) == [0, 1, 2, 3]
    finally:
        em.close(timeout=10)
        ledger.kill()
