"""runledger's logging API: two lines in any training loop, exactly once, hash-chained, queryable with SQL.

    import runledger

    run = runledger.init(project="mnist", config={"lr": 1e-3})
    for step in range(steps):
        ...
        runledger.log({"train/loss": loss, "val/accuracy": acc})
    run.finish()

then `runledger sql "select step, value from metrics where key = 'train/loss'"` or `runledger report RUN`.
The module-level functions act on the current run (the last `init`), like W&B's, so a W&B script runs
with `import runledger as wandb`: init, log, config, summary, alert, finish, define_metric, run.
See `runledger.core` for what each call records, and `runledger.levanter` for Levanter's tracker.
"""

from __future__ import annotations

from typing import Any

from runledger.core import AlertLevel, Config, LogError, Run, Summary, init

__all__ = ["AlertLevel", "Config", "LogError", "Run", "Summary", "alert", "define_metric", "finish", "init", "log"]


def _current() -> Run:
    from runledger.core import _Current

    if _Current.run is None:
        raise LogError("no run: call runledger.init() first")
    return _Current.run


def log(data: dict, step: int | None = None, commit: bool | None = None) -> None:
    """`Run.log` of the current run."""
    _current().log(data, step, commit)


def finish(exit_code: int | None = None, quiet: bool | None = None, status: str | None = None) -> bool:
    """`Run.finish` of the current run (nothing if none)."""
    from runledger.core import _Current

    return True if _Current.run is None else _Current.run.finish(status, exit_code)


def alert(title: str, text: str, level: str = AlertLevel.INFO, wait_duration: Any = None) -> None:
    """`Run.alert` of the current run."""
    _current().alert(title, text, level, wait_duration)


def define_metric(name: str, step_metric: str | None = None, **kw: Any) -> None:
    """Accepted for W&B scripts (see `Run.define_metric`)."""


def __getattr__(name: str) -> Any:
    """`runledger.run`, `.config`, `.summary`: the current run's (None, or empty, before `init`)."""
    from runledger.core import _Current

    if name == "run":
        return _Current.run
    if name in ("config", "summary"):
        return getattr(_Current.run, name) if _Current.run is not None else (Config({}) if name == "config" else Summary())
    raise AttributeError(f"module 'runledger' has no attribute {name!r}")
