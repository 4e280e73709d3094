"""`runledger demo`: the smallest end-to-end path until the full demo lands (issue 7).

Local NATS → ledger service → a producer emitting a few hundred events of a synthetic run →
an audit query over the ledger → `verify` → everything stopped. It prints what it did.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import tempfile
import time
from pathlib import Path

from ledger import service
from ledger.emitter import Emitter
from ledger.natsserver import NatsServer
from ledger.verify import verify

log = logging.getLogger(__name__)


def emit_synthetic_run(em: Emitter, steps: int, seed: int = 0) -> None:
    """A run-shaped stream: run_started, then step + drops per step, an eval every 50, run_finished."""
    rng = random.Random(seed)
    tokens = 8192
    em.emit("run_started", {
        "config": {"preset": "synthetic", "steps": steps}, "config_hash": "0" * 64, "token_budget": steps * tokens,
        "tokens_per_step": tokens, "schedule": {"peak_lr": 3e-3, "warmup_steps": 10, "horizon_tokens": steps * tokens,
                                               "min_lr_ratio": 0.05},
        "data_mixture": {"code": 0.5, "prose": 0.3, "math": 0.2},
    }, step=0)
    for s in range(steps):
        loss = 2.0 + 8.0 * math.exp(-s / 60) + rng.gauss(0, 0.02)
        em.emit("step", {"loss": loss, "grad_norm": 0.5 + rng.random() * 0.2, "lr": 3e-3, "tokens": tokens,
                         "step_time_s": 0.1, "router_entropy": 2.0}, step=s)
        assignments = tokens * 8 * 2
        dropped = int(assignments * 0.03 * rng.random())
        em.emit("drops", {"dispatch": "capacity", "assignments": assignments, "dropped": dropped,
                          "drop_fraction": dropped / assignments}, step=s)
        if s % 50 == 49:
            em.emit("eval", {"loss": loss + 0.1, "domain_losses": {"code": loss, "prose": loss + 0.2}}, step=s)
    em.emit("run_finished", {"status": "completed", "final_step": steps - 1, "tokens_seen": steps * tokens}, step=steps - 1)


async def _run(root: Path, steps: int) -> int:
    import queries

    server = NatsServer(root / "nats").start()
    stop = asyncio.Event()
    ledger_task = asyncio.create_task(service.serve(root, server.url, stop))
    try:
        em = Emitter("demo-run", "worker-0", 0, server.url, root / "spool")
        await asyncio.to_thread(emit_synthetic_run, em, steps)
        await asyncio.to_thread(em.close)
        expected = em.next_seq
        for _ in range(600):
            con = queries.connect(root)
            if con.execute("select count(*) from events").fetchone()[0] >= expected:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await ledger_task
        con = queries.connect(root)
        rows = con.execute(
            "select count(*) as steps, round(min(loss), 3), round(max(grad_norm), 3), "
            "(select round(max(drop_fraction), 4) from drops) from steps where run_id = 'demo-run'").fetchone()
        log.info("ledger: %d events stored under %s", expected, root)
        log.info("audit: %d steps, min loss %s, max grad norm %s, max drop fraction %s", *rows)
        report = verify(root)
        log.info("verify: %s", report.text().replace("\n", " | "))
        return 0 if report.ok else 1
    finally:
        stop.set()
        server.stop()


def run_demo(root: Path | None, quick: bool = False) -> int:
    if root is None:  # a fresh root each time, so a second demo never mixes with the first
        Path("runledger-data").mkdir(exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=time.strftime("demo-%Y%m%d-%H%M%S-"), dir="runledger-data"))
    return asyncio.run(_run(Path(root).resolve(), 100 if quick else 300))
