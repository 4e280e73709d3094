"""The agents on a root served in partitions: news wakes them, they wait until the run's partition has
stored what woke them (runledger.ledger.storage.stored), and judge then, never after a wait that timed out."""

from __future__ import annotations

import asyncio
import threading

from runledger.agents import runner
from runledger.ledger.emit.emitter import Emitter
from support.processes import LedgerProcess
from support.reading import wait_for_count

STEP = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.05}
START = {"config": {}, "config_hash": "0" * 64, "token_budget": None}


def test_agents_on_a_partitioned_root_judge_once_the_runs_partition_stored_what_woke_them(tmp_path, nats_server, root,
                                                                                          monkeypatch):
    waits: list[bool] = []  # each wake's wait: True once stored, False had it timed out (STORED_WAIT_S)
    stored = runner.until_stored

    async def until_stored(root, upto, timeout_s):
        waits.append(await stored(root, upto, timeout_s))
        return waits[-1]

    monkeypatch.setattr(runner, "until_stored", until_stored)
    # a wait long enough that a slow commit on a loaded machine never ends one: a wait reading the wrong
    # position (the single ledger's, which a partitioned root never moves) still ends in False
    monkeypatch.setattr(runner, "STORED_WAIT_S", 30.0)
    ledger = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log", "--partitions", "2").start()
    loop, stop = asyncio.new_event_loop(), asyncio.Event()
    agents = threading.Thread(target=loop.run_until_complete, daemon=True,
                              args=(runner.run_agents(root, nats_server.url, stop=stop, poll_s=0.25, sweep_s=3600),))
    agents.start()
    try:
        em = Emitter("spiky", "worker-0", 0, nats_server.url, tmp_path / "spool")
        em.emit_dict("run_started", START, step=0)
        for k in range(1, 61):
            em.emit_dict("step", {**STEP, "grad_norm": 10.0 if k == 58 else 1.0}, step=k)
        assert em.close(timeout=60)
        assert wait_for_count(root, "select count(*) from alerts where rule = 'grad_norm_high'", 1, timeout=60) == 1
        assert waits and all(waits), waits  # woken, and every wait ended with the events stored
    finally:
        loop.call_soon_threadsafe(stop.set)
        agents.join(30)
        ledger.terminate()
