"""A source run as the importers read it: its events in a fixed order, with the source's own times and provenance.

A reader (tensorboard.py, mlflow.py, wandb.py) turns one run of another tracker into a `SourceRun`:
`run_started` first (the source's config, with where it came from under the config key `_import`),
then every point the source holds as `metrics` (and `system`, `config`) events in an order that only
ever grows at the end while the source is appended to, and a closing `run_finished` when the source
says the run ended (TensorBoard says nothing: its import closes at the last event's time). Each event
carries the source's time, so reading the same source twice gives the same events, byte for byte:
that is what makes a re-import a no-op (`runledger.interop.importers.bring`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.events import MAX_METRIC_NAME, MAX_METRICS, NAME_RE

IMPORT_KEY = "_import"  # the config key holding an imported run's provenance (as W&B keeps `_wandb`)


@dataclass(frozen=True)
class SourceEvent:
    """One event to import: its kind, payload (a valid payload of that kind), step and RFC 3339 time."""

    kind: str
    payload: dict
    step: int | None
    time: str


@dataclass
class SourceRun:
    """One run of another tracker, read: who it is, where it is, and its events in order."""

    source: str  # "tensorboard", "mlflow" or "wandb"
    source_run_id: str
    uri: str  # the file, folder or tracking URI it was read from
    run_id: str  # the ledger's run id derived from the source's identity (--run-id overrides it)
    events: list[SourceEvent] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # points not imported, by reason (e.g. images)

    @property
    def producer(self) -> str:
        return PRODUCERS[self.source]

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n


PRODUCERS = {"tensorboard": "import-tb", "mlflow": "import-mlflow", "wandb": "import-wandb"}


class SourceError(ValueError):
    """A source that cannot be read as asked (no such run, not a run's files): a one-line reason."""


@functools.lru_cache(maxsize=4096)
def _second_text(sec: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))  # (formatting is most of the cost: cached)


def seconds_text(seconds: float) -> str:
    """Seconds since the epoch (a float, as TensorBoard and W&B keep them) as RFC 3339 UTC to the microsecond."""
    sec, frac = divmod(round(seconds * 1_000_000), 1_000_000)
    return f"{_second_text(sec)}.{frac:06d}Z"


def millis_text(ms: int) -> str:
    """Milliseconds since the epoch (MLflow's) as RFC 3339 UTC, exactly."""
    sec, frac = divmod(int(ms), 1000)
    return f"{_second_text(sec)}.{frac:03d}Z"


def nanos_text(seconds: int, nanos: int) -> str:
    """A protobuf Timestamp (W&B's) as RFC 3339 UTC, exactly."""
    return f"{_second_text(seconds)}.{nanos:09d}Z"


def run_id_of(prefix: str, name: str, identity: str | None = None) -> str:
    """A valid run id from the source's: `prefix-name`, name slugged; with `identity`, a short hash of it
    appended (for a source whose name alone is not unique, e.g. a TensorBoard folder)."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")
    tail = f"-{hashlib.sha256(identity.encode()).hexdigest()[:8]}" if identity is not None else ""
    run_id = f"{prefix}-{slug}"[:64 - len(tail)].rstrip("-_") + tail
    if not NAME_RE.fullmatch(run_id):
        raise SourceError(f"no valid run id from {name!r}: pass --run-id")
    return run_id


@functools.lru_cache(maxsize=65_536)
def check_metric_name(name: str) -> str:
    """The name, if the ledger can keep it as a metric's (SourceError if not); each name checked once."""
    if not name or len(name) > MAX_METRIC_NAME or re.search(r"[\x00-\x1f\x7f]", name):
        raise SourceError(f"metric name {name[:60]!r} cannot be kept (1 to {MAX_METRIC_NAME} characters, no control "
                          "characters)")
    return name


def metric_value(value: float, metrics: dict, nonfinite: dict, name: str) -> None:
    """Put one value in a payload: a finite float as itself, else null and named in `nonfinite`."""
    if value - value == 0.0:
        metrics[name] = value
    else:
        metrics[name] = None
        nonfinite[name] = "nan" if value != value else ("inf" if value > 0 else "-inf")


def grouped(kind: str, points: Iterable[tuple[int | None, Any, str, float]], time_text: Callable[[Any], str]) -> list[SourceEvent]:
    """(step, time, name, value) points, in source order, as `kind` events: consecutive points at one step
    go in one event (at its first point's time, as `time_text` writes it) until a name comes again or
    MAX_METRICS are in it."""
    events: list[SourceEvent] = []
    metrics: dict = {}
    nonfinite: dict = {}
    step = at = None

    def close() -> None:
        if metrics:
            payload = {"metrics": dict(metrics)}
            if nonfinite:
                payload["nonfinite"] = dict(nonfinite)
            events.append(SourceEvent(kind, payload, step, time_text(at)))
        metrics.clear()
        nonfinite.clear()

    for p_step, p_time, name, value in points:
        if p_step != step or name in metrics or len(metrics) >= MAX_METRICS:
            close()
            step, at = p_step, p_time
        metric_value(value, metrics, nonfinite, name)
    close()
    return events


def run_started(run: SourceRun, time_text: str, config: dict, *, tags: Iterable[str] = (), project: str | None = None,
                hardware: dict | None = None, extra: dict | None = None) -> SourceEvent:
    """The import's `run_started`: the source's config with the provenance under `_import`."""
    config = {**config, IMPORT_KEY: {"source": run.source, "source_run_id": run.source_run_id, "uri": run.uri,
                                     **(extra or {})}}
    payload = {"config": config, "config_hash": hashlib.sha256(canonical_json(config).encode()).hexdigest(),
               "tags": ["imported", f"source:{run.source}", *tags]}
    if project:
        payload["project"] = project
    if hardware:
        payload["hardware"] = hardware
    return SourceEvent("run_started", payload, None, time_text)


def run_finished(status: str, time_text: str, metric_events: list[SourceEvent], reason: str | None = None,
                 summary: dict | None = None) -> SourceEvent:
    """The import's `run_finished`: the status, the last step and (unless given) each metric's last value."""
    if summary is None:
        summary = {}
        for e in metric_events:
            if e.kind == "metrics":
                summary.update(e.payload["metrics"])
    summary = dict(list(summary.items())[-MAX_METRICS:])
    steps = [e.step for e in metric_events if e.step is not None]
    payload: dict = {"status": status, "summary": summary}
    if steps:
        payload["final_step"] = max(steps)
    loss = summary.get("loss", summary.get("train/loss"))
    if type(loss) is float:
        payload["final_loss"] = loss
    if reason:
        payload["reason"] = reason
    return SourceEvent("run_finished", payload, payload.get("final_step"), time_text)


def check_step(step: int, where: str) -> int:
    if not 0 <= step < 2**63:
        raise SourceError(f"{where}: step {step} is not an integer >= 0 (as the ledger's steps are)")
    return step
