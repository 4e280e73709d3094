"""audits: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runledger.training.schedule import make_schedule, retime
from support.audit_ledger import STEPS, Ledger, write_run


@pytest.fixture(scope="module")
def suites_root(tmp_path_factory) -> Path:
    suites_root = tmp_path_factory.mktemp("suites") / "ledger"
    led = Ledger(suites_root)
    write_run(led, "clean", forecasts="hit")
    write_run(led, "fc-miss", forecasts="miss")
    # attempt 0 retimes the decay at step 200 and dies at 250; attempt 1 resumes from the step-200
    # checkpoint with a new commit and the retimed schedule, as the worker carries it
    retimed = retime(make_schedule(1e-3, 20, STEPS, 0.05, tokens_per_step=1024), 201, 300)  # as the worker retimed it
    write_run(led, "resumed", last=250, finish=False)
    write_run(led, "resumed", attempt=1, first=201, t_offset=10, retime_at=None, schedule=retimed,
              resumed_from=RESUME, code_commit="def456")
    # the same, but the resumed worker lost the retime: back on the original schedule
    write_run(led, "lost-retime", last=250, finish=False)
    write_run(led, "lost-retime", attempt=1, first=201, t_offset=10, retime_at=None,
              resumed_from=dict(RESUME, path="ckpt/lost-retime/200"))
    # resumed from a checkpoint the ledger never saw
    write_run(led, "orphan", last=150, finish=False)
    write_run(led, "orphan", attempt=1, first=151, t_offset=10, retime_at=None,
              resumed_from={"path": "elsewhere/150", "step": 150, "content_hash": "e" * 64})
    # a fork of the clean run from its step-200 checkpoint
    write_run(led, "fork", first=201, retime_at=None, schedule=retimed,
              parent={"run_id": "clean", "step": 200, "content_hash": f"{200:064x}", "path": "ckpt/clean/200"})
    led.write()
    return suites_root


RESUME = {"path": "ckpt/resumed/200", "step": 200, "content_hash": f"{200:064x}"}
