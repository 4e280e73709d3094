"""runledger's logging API: two lines in any training loop, exactly once, hash-chained, queryable with SQL.

    import runledger

    run = runledger.init(project="mnist", config={"lr": 1e-3})
    for step in range(steps):
        ...
        runledger.log({"train/loss": loss, "val/accuracy": acc})
    run.finish()

then `runledger sql "select step, value from metrics where key = 'train/loss'"` or `runledger report RUN`.
The module-level functions act on the current run (the last `init`), like W&B's, so a W&B script runs
with `import runledger as wandb`: init, log, config, summary, alert, finish, define_metric, run, and the
other calls W&B scripts make (save, log_artifact, Artifact, plot, watch, login, Settings, sweep, ...:
`runledger.wandb_compat`, each working or skipped with one warning). Histogram, Table, Image and File values
in `log` are events of their own, exactly (`runledger.values`). `runledger.Api` reads runs back, every point
(`runledger.api`).
See `runledger.core` for what each call records (`log_checkpoint`: a saved checkpoint's content hash),
`runledger.levanter` for Levanter's tracker and `runledger.integrations` for the Hugging Face Trainer's callback,
Lightning's logger and Keras' callback.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AlertLevel", "Api", "ApiError", "Artifact", "Audio", "Config", "File", "Histogram", "Html", "Image", "LogError", "Object3D", "Run", "Settings", "Summary", "Table", "Video",
           "alert", "define_metric", "finish", "init", "log", "log_artifact", "log_checkpoint", "log_code", "login", "mark_preempting", "plot",
           "save", "sweep", "unwatch", "use_artifact", "watch"]
# Loaded on first use, so that `import runledger` costs almost nothing and loads no pyarrow, duckdb or JAX
# (tests/{unit,integration}/test_layers.py): the classes from runledger.core, `run`/`config`/`summary` from the current run.
_FROM_CORE = {"AlertLevel", "Config", "LogError", "Run", "Summary"}
# W&B's other names, from runledger.wandb_compat (also on first use)
_FROM_COMPAT = {"Artifact", "Settings", "plot", "login", "sweep", "watch", "unwatch"}
# the values `log` stores as events of their own, from runledger.values (standard library only; numpy when used)
_FROM_VALUES = {"Audio", "File", "Histogram", "Html", "Image", "Object3D", "Table", "Video"}


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


def finish(exit_code: int | None = None, quiet: bool | None = None, status: str | None = None,
           wait: bool | None = None) -> bool:
    """`Run.finish` of the current run (nothing if none)."""
    from runledger.core import Current

    return True if Current.run is None else Current.run.finish(status, exit_code, wait=wait)


def alert(title: str, text: str | None = None, level: str | None = "INFO", wait_duration: Any = None,
          webhook_url: str | None = None) -> None:
    """`Run.alert` of the current run (W&B's and Trackio's arguments)."""
    _current().alert(title, text, level, wait_duration, webhook_url)


def define_metric(name: str, step_metric: str | None = None, **kw: Any) -> None:
    """`Run.define_metric` of the current run."""
    _current().define_metric(name, step_metric, **kw)


def save(glob_str: Any = None, base_path: Any = None, policy: str = "live") -> list[str]:
    """`Run.save` of the current run: each matching file's path and SHA-256 recorded."""
    return _current().save(glob_str, base_path, policy)


def log_checkpoint(path: Any, step: int | None = None, *, seconds: float | None = None, reason: str = "periodic",
                   tokens_seen: int | None = None) -> dict:
    """`Run.log_checkpoint` of the current run: a `checkpoint` event with the saved file's or folder's content hash."""
    return _current().log_checkpoint(path, step, seconds=seconds, reason=reason, tokens_seen=tokens_seen)


def log_artifact(artifact_or_path: Any, name: str | None = None, type: str | None = None, aliases: Any = None,
                 tags: Any = None) -> Any:
    """`Run.log_artifact` of the current run: each file's path and SHA-256 recorded."""
    return _current().log_artifact(artifact_or_path, name, type, aliases, tags)


def use_artifact(artifact_or_name: Any, type: str | None = None, aliases: Any = None, use_as: str | None = None) -> Any:
    """`Run.use_artifact` of the current run (skipped, with one warning)."""
    return _current().use_artifact(artifact_or_name, type, aliases, use_as)


def log_code(*args: Any, **kwargs: Any) -> None:
    """`Run.log_code` of the current run (skipped, with one warning)."""
    _current().log_code(*args, **kwargs)


def mark_preempting() -> None:
    """`Run.mark_preempting` of the current run (skipped, with one warning)."""
    _current().mark_preempting()


def __getattr__(name: str) -> Any:
    """The classes of `runledger.core`; `runledger.run`, `.config`, `.summary`: the current run's (None, or
    empty, before `init`)."""
    if name in _FROM_CORE:
        import runledger.core

        return getattr(runledger.core, name)
    if name in ("Api", "ApiError"):  # (runledger.api imports nothing heavy until a read is made)
        import runledger.api

        return getattr(runledger.api, name)
    if name in _FROM_COMPAT:
        import runledger.wandb_compat

        return getattr(runledger.wandb_compat, name)
    if name in _FROM_VALUES:
        import runledger.values

        return getattr(runledger.values, name)
    if name in ("run", "config", "summary"):
        from runledger.core import Config, Current, Summary

        if name == "run":
            return Current.run
        return getattr(Current.run, name) if Current.run is not None else (Config({}) if name == "config" else Summary())
    raise AttributeError(f"module 'runledger' has no attribute {name!r}")
