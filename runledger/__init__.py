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

__all__ = ["AlertLevel", "Config", "LogError", "Run", "Summary", "alert", "define_metric", "finish", "init", "log"]
# Loaded on first use, so that `import runledger` costs almost nothing and loads no pyarrow, duckdb or JAX
# (tests/{unit,integration}/test_layers.py): the classes from runledger.core, `run`/`config`/`summary` from the current run.
_FROM_CORE = {"AlertLevel", "Config", "LogError", "Run", "Summary"}


def init(*args: Any, **kwargs: Any):
    """Start a run (see `runledger.core.init`)."""
    from runledger.core import init as start

    return start(*args, **kwargs)


def _current():
    from runledger.core import Current, LogError

    if Current.run is None:
        raise LogError("no run: call runledger.init() first")
    return Current.run


def log(data: dict, step: int | None = None, commit: bool | None = None) -> None:
    """`Run.log` of the current run."""
    _current().log(data, step, commit)


def finish(exit_code: int | None = None, quiet: bool | None = None, status: str | None = None) -> bool:
    """`Run.finish` of the current run (nothing if none)."""
    from runledger.core import Current

    return True if Current.run is None else Current.run.finish(status, exit_code)


def alert(title: str, text: str, level: str = "INFO", wait_duration: Any = None) -> None:
    """`Run.alert` of the current run."""
    _current().alert(title, text, level, wait_duration)


def define_metric(name: str, step_metric: str | None = None, **kw: Any) -> None:
    """Accepted for W&B scripts (see `Run.define_metric`)."""


def __getattr__(name: str) -> Any:
    """The classes of `runledger.core`; `runledger.run`, `.config`, `.summary`: the current run's (None, or
    empty, before `init`)."""
    if name in _FROM_CORE:
        import runledger.core

        return getattr(runledger.core, name)
    if name in ("run", "config", "summary"):
        from runledger.core import Config, Current, Summary

        if name == "run":
            return Current.run
        return getattr(Current.run, name) if Current.run is not None else (Config({}) if name == "config" else Summary())
    raise AttributeError(f"module 'runledger' has no attribute {name!r}")
