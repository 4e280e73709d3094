"""An MLflow run read into a `SourceRun` with MLflow's own client: every metric's whole history, params, tags, times.

`MlflowClient(tracking_uri=...)` (mlflow-skinny) on any store it reads: a database (`sqlite:///f.db`),
a file store (`file:///…/mlruns`, or its folder), a tracking server (`http://…`). The run: `--source-run`,
the run whose folder was given (`mlruns/EXP/RUN`), or the store's only run. Every key's
`get_metric_history` (every step, each value as the float64 MLflow stored, with its timestamp) becomes
`metrics` events, one per step (a key logged twice at one step: two events), in the order
(step, timestamp, key); keys under `system/` (MLflow's system metrics) become `system` events. Params
(strings, as MLflow keeps them) are the config; tags that are not MLflow's own (`mlflow.*`) are tags
`key=value`, MLflow's under the config's `_import`; the run's start is `run_started`'s time, and a run
that ended (FINISHED, FAILED, KILLED) gets `run_finished` at its end time.

The source is checked before MLflow sees it, as MLflow would make what it does not find (a file
store's folders, an empty SQLite database): a scheme MLflow tracks with, a file store that is there
(a folder holding an experiment's `meta.yaml`), a SQLite file that is one; a tracking server is asked
with few retries (MLflow's default backs off for minutes).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from runledger.interop.importers.source import (SourceError, SourceRun, check_metric_name, check_step, grouped, millis_text, run_finished, run_id_of, run_started)

SYSTEM_PREFIX = "system/"  # mlflow.enable_system_metrics_logging() logs under it
SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")  # MLflow's tracking stores
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first bytes of every SQLite database file
HTTP_RETRIES = "2"  # MLFLOW_HTTP_REQUEST_MAX_RETRIES for a tracking server (MLflow's default 7 waits minutes)
HTTP_TIMEOUT_S = "20"  # MLFLOW_HTTP_REQUEST_TIMEOUT (MLflow's default 120)
STATUS = {"FINISHED": "completed", "FAILED": "failed", "KILLED": "stopped"}


def tracking_uri(where: str) -> tuple[str, str | None]:
    """(tracking URI, the run id a run folder names) from a URI, a store folder, a run folder or a .db file."""
    if where.startswith("sqlite:///") and not where.startswith("sqlite:////"):  # a relative path: made absolute
        where = f"sqlite:///{Path(where[len('sqlite:///'):]).resolve()}"
    if "://" in where or where.startswith(("sqlite:", "file:", "databricks")):
        scheme = urlparse(where).scheme.split("+")[0].lower()
        if scheme not in SCHEMES:
            raise SourceError(f"{where} is not an MLflow tracking URI (schemes: {', '.join(SCHEMES)}; or a store's folder)")
        if scheme == "sqlite":
            _sqlite_file(Path(unquote(urlparse(where).path)), where)
        if scheme == "file":
            _file_store(Path(unquote(urlparse(where).path)), where)
        return where, None
    path = Path(where).resolve()
    if path.is_file():
        return f"sqlite:///{_sqlite_file(path, where)}", None
    if (path / "meta.yaml").is_file() and (path / "metrics").is_dir():  # a run's folder: STORE/EXP/RUN
        return _file_store(path.parent.parent, where).as_uri(), path.name
    if path.is_dir():
        return _file_store(path, where).as_uri(), None
    raise SourceError(f"no MLflow store at {where}")


def _sqlite_file(path: Path, where: str) -> Path:
    """`path`, if it is a SQLite database (MLflow would make an empty one where there is none)."""
    with open(path, "rb") as f:  # (OSError: missing, unreadable: read_source says it in one line)
        if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise SourceError(f"{where} is not an MLflow store (neither a SQLite database nor a store's folder)")
    return path


def _file_store(path: Path, where: str) -> Path:
    """`path`, if it is an MLflow file store: a folder holding an experiment (MLflow would make one)."""
    if not path.is_dir():
        raise SourceError(f"no MLflow store at {where}")
    if not any(e.is_file() for e in path.glob("*/meta.yaml")):
        list(path.iterdir())  # (a folder it may not list: PermissionError, said in one line)
        raise SourceError(f"{where} is not an MLflow store (no experiment folder with a meta.yaml in it)")
    return path


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    if uri.startswith("file:"):  # MLflow 3 reads a file store only when asked to (it is in maintenance mode)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", HTTP_RETRIES)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # (a line per retry: the refusal says it)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_TIMEOUT_S)
    return MlflowClient(tracking_uri=uri)


def _only_run(client, uri: str) -> str:
    from mlflow.entities import ViewType

    runs = [r.info.run_id for e in client.search_experiments(view_type=ViewType.ALL)
            for r in client.search_runs([e.experiment_id], run_view_type=ViewType.ALL, max_results=3)]
    if len(runs) != 1:
        raise SourceError(f"{uri} holds {'no runs' if not runs else 'several runs'}: pick one with --source-run ID"
                          + (f" (e.g. {', '.join(runs[:3])})" if runs else ""))
    return runs[0]


def read(where: str, source_run: str | None = None) -> SourceRun:
    """The MLflow run at `where` (see the module docstring)."""
    from mlflow.exceptions import MlflowException

    uri, named = tracking_uri(where)
    try:
        client = _client(uri)
        run_id = source_run or named or _only_run(client, uri)
        mrun = client.get_run(run_id)
        experiment = client.get_experiment(mrun.info.experiment_id)
        keys = sorted(mrun.data.metrics)
        history = {key: client.get_metric_history(run_id, key) for key in keys}
    except MlflowException as err:
        raise SourceError(f"MLflow at {uri}: {(str(err).strip().splitlines() or [type(err).__name__])[0]}") from None
    info = mrun.info
    run = SourceRun("mlflow", run_id, uri, run_id_of("mlflow", run_id))
    points = {"metrics": [], "system": []}
    for key, metrics in history.items():
        kind = "system" if key.startswith(SYSTEM_PREFIX) else "metrics"
        name = check_metric_name(key[len(SYSTEM_PREFIX):] if kind == "system" else key)
        for m in metrics:
            points[kind].append((check_step(m.step, f"metric {key}"), m.timestamp, name, float(m.value)))
    events = []
    for kind, found in points.items():
        found.sort(key=lambda p: (p[0], p[1], p[2]))
        events += grouped(kind, found, millis_text)
    events.sort(key=lambda e: (e.step, e.time, e.kind))  # (stable: a step's metrics, then its system sample)
    own = {k: v for k, v in mrun.data.tags.items() if not k.startswith("mlflow.")}
    mlflow_tags = {k: v for k, v in sorted(mrun.data.tags.items()) if k.startswith("mlflow.")}
    run.events = [run_started(run, millis_text(info.start_time), dict(sorted(mrun.data.params.items())),
                              tags=[f"{k}={v}" for k, v in sorted(own.items())], project=experiment.name,
                              extra={"run_name": info.run_name, "tags": mlflow_tags}),
                  *events]
    status = STATUS.get(info.status)
    if status is not None and info.end_time is not None:
        last = {}
        for e in events:
            if e.kind == "metrics":
                last.update(e.payload["metrics"])
        run.events.append(run_finished(status, millis_text(info.end_time), events, summary=last,
                                       reason=f"MLflow status {info.status}"))
    return run
