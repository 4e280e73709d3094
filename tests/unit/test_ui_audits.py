"""A run's audit panels (runledger.ui.audits): kept in the cache folder by the files they read, so that a restart
of the dashboard answers them without auditing again; after a new file, the last answer at once, marked stale,
while the new files are audited in the background, then the new answer."""

from __future__ import annotations

import time

from support.audit_ledger import STEPS, Ledger, write_run
import pytest

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

WATCHDOG_S = 60.0  # a hang guard, not a promise of speed


def test_audits_survive_a_restart_and_a_new_file_is_answered_stale_then_fresh(tmp_path, monkeypatch):
    import runledger.queries.audit as audit
    from runledger.ui.data import Reader

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    runs = []  # each audit of this root (run_suite, spied on; another test's dashboard may still audit its own)
    real, root = audit.run_suite, tmp_path / "root"

    def spy(at, suite, run_id, *a, **k):
        if at == root:
            runs.append((suite, run_id))
        return real(at, suite, run_id, *a, **k)

    monkeypatch.setattr(audit, "run_suite", spy)
    led = Ledger(tmp_path / "root")
    write_run(led, "r", last=STEPS - 100, finish=False)
    led.write()

    reader = Reader(tmp_path / "root")
    try:
        first = reader.audits.answer("r", "health")
        assert not first["stale"] and runs == [("health", "r")]
        checks = {row[1] for r in first["results"] for row in r["rows"]}
        assert "config_match" in checks
    finally:
        reader.close()

    runs.clear()
    reader = Reader(tmp_path / "root")  # a restart, the cache folder kept: nothing audited again
    try:
        again = reader.audits.answer("r", "health")
        assert runs == [] and not again["stale"] and again["results"] == first["results"]
        write_run(led, "r", first=STEPS - 99, with_start=False)  # the run goes on: new files
        led.write()
        stale = reader.audits.answer("r", "health")
        assert stale["stale"] and stale["results"] == first["results"]  # the last answer, at once
        t0 = time.monotonic()
        while (got := reader.audits.answer("r", "health"))["stale"]:
            assert time.monotonic() - t0 < WATCHDOG_S, "the new files were never audited"
            time.sleep(0.1)
        assert runs == [("health", "r")] and got["computed_at"] > first["computed_at"]
        assert reader.audits.audit("r", "health") == got["results"]
    finally:
        reader.close()


def test_closing_waits_for_the_audit_under_way_and_starts_none_after(tmp_path, monkeypatch):
    """A dashboard stopping while an audit runs in a background thread waits for it: a thread still inside
    DuckDB when the interpreter exits aborts the process (`terminate called ... exception not rethrown`)."""
    import threading

    import runledger.queries.audit as audit
    from runledger.ui.data import Reader

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    started, release = threading.Event(), threading.Event()
    real, root = audit.run_suite, tmp_path / "root"

    def held(at, *a, **k):
        if at == root:
            started.set()
            release.wait(60)
        return real(at, *a, **k)

    monkeypatch.setattr(audit, "run_suite", held)
    led = Ledger(root)
    write_run(led, "r")
    led.write()
    reader = Reader(root)
    auditing = threading.Thread(target=reader.audits.answer, args=("r", "health"), daemon=True)
    auditing.start()
    assert started.wait(60)
    closing = threading.Thread(target=reader.close, daemon=True)
    closing.start()
    closing.join(0.5)
    assert closing.is_alive(), "close() returned with an audit still running"
    release.set()
    closing.join(60)
    auditing.join(60)
    assert not closing.is_alive() and not auditing.is_alive()
    with pytest.raises(RuntimeError, match="closing"):
        reader.audits.compute("r", "health", ["another file"])
