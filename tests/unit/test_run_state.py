"""The `state` of a run in the `runs` view (the contract's RUN_STATES): finished, failed, running, and
crashed once its heartbeats stopped (older than HEARTBEAT_MISSED of their interval) with no run_finished."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from runledger import queries
from runledger.ledger.contract.events import RUN_STATES
from support.audit_ledger import Ledger

START = {"config": {}, "config_hash": "0" * 64}


def test_each_state_is_read_from_the_run_finished_and_the_heartbeats(tmp_path):
    now = datetime.now(timezone.utc)
    led = Ledger(tmp_path)
    beat = {"host": "h", "pid": 1, "interval_s": 30.0}
    for run, finish in (("done", "completed"), ("broke", "failed"), ("halted", "stopped")):
        led.emit(run, "run_started", {**START, "heartbeat_s": 30.0}, None, now - timedelta(minutes=10))
        led.emit(run, "run_finished", {"status": finish}, None, now - timedelta(minutes=9))
    led.emit("alive", "run_started", {**START, "heartbeat_s": 30.0}, None, now - timedelta(minutes=10))
    led.emit("alive", "heartbeat", beat, None, now - timedelta(seconds=20))
    led.emit("killed", "run_started", {**START, "heartbeat_s": 30.0}, None, now - timedelta(minutes=10))
    led.emit("killed", "heartbeat", beat, None, now - timedelta(seconds=80))  # past 2.5 intervals
    led.emit("killed-early", "run_started", {**START, "heartbeat_s": 30.0}, None, now - timedelta(minutes=5))
    led.emit("no-beats", "run_started", START, None, now - timedelta(days=1))  # (a run from before heartbeats)
    led.write()
    states = dict(queries.connect(tmp_path).execute("select run_id, state from runs").fetchall())
    assert states == {"done": "finished", "broke": "failed", "halted": "failed", "alive": "running",
                      "killed": "crashed", "killed-early": "crashed", "no-beats": "running"}
    assert set(states.values()) <= set(RUN_STATES)
