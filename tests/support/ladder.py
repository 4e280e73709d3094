"""ladder: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from runledger.ledger.contract.events import StepCompleted
from runledger.ledger.ingest import service
from runledger.training.ladder_fit import Law
from runledger.training.schedule import lr_at


def law_loss(tokens, rng) -> np.ndarray:
    tokens = np.asarray(tokens, float)
    return LAW.loss(tokens * FPT) * (1 + 0.005 * rng.standard_normal(tokens.shape))


def step_event(k: int, schedule: dict, rng) -> StepCompleted:
    return StepCompleted(loss=float(law_loss([k * T], rng)[0]), grad_norm=0.5, lr=lr_at(k, **schedule), tokens=T,
                         step_time_s=0.1)


def schedule(steps: int) -> dict:
    return {"peak_lr": 3e-3, "warmup_steps": 5, "horizon_steps": steps, "min_lr_ratio": 0.05,
            "tokens_per_step": TOKENS_PER_STEP}


LAW = Law(E=0.6, A=30.0, alpha=0.1)


FPT = 1e5


T = 512  # tokens per step


TOKENS_PER_STEP = 512


def serve_in_thread(root, url) -> tuple[threading.Thread, asyncio.Event, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    t = threading.Thread(target=loop.run_until_complete, args=(service.serve(root, url, stop=stop),), daemon=True)
    t.start()
    return t, stop, loop
