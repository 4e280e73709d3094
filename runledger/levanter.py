"""Levanter's tracker on runledger: `tracker: {type: runledger}` in a Levanter config records the trainer's
metrics, hyperparameters, summary and artifacts in the ledger, as `runledger.init` / `log` / `finish` do.

The interface is Levanter's `Tracker` (name, log_hyperparameters, log, log_summary, log_artifact, finish)
and `TrackerConfig` (a draccus plugin registry; `init(run_id)` builds the tracker), as defined in
marin-community/levanter src/levanter/tracker/tracker.py (commit 9fde0781a1737e088535c392cf239aba5e1143e2,
the last to change it as of 9263f81e, 2025-09-26). With levanter importable, `RunledgerTracker` subclasses
its `Tracker` and `RunledgerConfig` is registered as the `runledger` choice of `TrackerConfig`; without it
both work alone, with the same methods. draccus looks for plugins under `levanter.tracker` only, so import
this module before the config is parsed:

    import runledger.levanter  # noqa: F401  (registers `tracker: {type: runledger, project: ...}`)

What each call records:
- `log(metrics, step=, commit=)`: `Run.log`, with W&B's step semantics as Levanter's W&B tracker passes
  them on: a call with a step and commit=None adds to that step, which is recorded as one `metrics` event
  when a call for another step comes, a call commits, or the run finishes (the trainer logs one step in
  several calls); commit=True records it now. Values: numbers, numpy and JAX scalars (0-d arrays),
  nested dicts (names joined by "/"), and Levanter's `Histogram` as a `histogram` event under NAME with its
  buckets, min, max, num, sum and sum_squares as they are (`runledger.values`), and as NAME/min, /max, /mean,
  /variance (what its W&B tracker logs beside the bins). Anything else (text, an array of several values) is no
  number the ledger holds: it is left out, with one warning per name.
- `log_hyperparameters(hparams)`: `run.config.update(hparams)`: a `config` event (view `config_updates`).
- `log_summary(metrics)`: `run.summary` (nested names joined by "/"), recorded by `finish` in
  `run_finished.summary`.
- `log_artifact(path, name=, type=)`: no bytes are copied. The config key `artifacts/NAME` (NAME: `name`,
  else the path's last part) records {"path", "type", "bytes", "sha256"}, read when it is logged (Levanter
  logs its config.yaml from a temporary directory that it deletes straight after). A directory's sha256 is
  that of its manifest, `sha256sum`'s lines ("HASH  RELATIVE/PATH\n") for its files in path order, with
  "files" their count; a path that is not on this machine (gs://...) is recorded with "sha256": null.
- `finish()`: `Run.finish()`: `run_finished` with the summary; True once the ledger stored everything.
On a multi-host run only JAX process 0 records (as Levanter's W&B and TensorBoard trackers do).
"""

import dataclasses
import logging
import numbers
import sys
from pathlib import Path
from typing import Any, List, Mapping, Optional, Union

import runledger
from runledger.content import content_of
from runledger.core import PRODUCER, Run, run_id_for

log = logging.getLogger("runledger.levanter")

try:
    from levanter.tracker import Tracker as _Tracker
    from levanter.tracker import TrackerConfig as _TrackerConfig
except ImportError:  # the PyPI `levanter` (2023) has no tracker package: work alone
    _Tracker = _TrackerConfig = None

HISTOGRAM_STATS = ("min", "max", "mean", "variance")  # as Levanter's WandbTracker logs a Histogram's


class RunledgerTracker(*((_Tracker,) if _Tracker is not None else ())):
    """A Levanter tracker recording into a runledger `Run` (see the module docstring for what each call
    records)."""

    name: str = "runledger"

    def __init__(self, run: Run) -> None:
        self.run = run
        self._left_out: set[str] = set()  # names already warned about

    def log_hyperparameters(self, hparams: dict[str, Any]):
        self.run.config.update(hparams)

    def log(self, metrics: Mapping[str, Any], *, step: Optional[int], commit: Optional[bool] = None):
        if commit is None and step is not None:
            commit = False  # W&B's: the step's values accumulate until another step or a commit
        values = self._numbers(metrics, "", {})
        if values:  # (none left: what waits for this step is recorded with the next step, or at finish)
            self.run.log(values, step=step, commit=commit)

    def log_summary(self, metrics: dict[str, Any]):
        self.run.summary.update(self._scalars(metrics, "", {}))

    def log_artifact(self, artifact_path, *, name: Optional[str] = None, type: Optional[str] = None):
        path = str(artifact_path)
        key = f"artifacts/{name or Path(path.rstrip('/')).name or path}"
        self.run.config.update({key: {"path": path, "type": type, **_content_of(path)}})

    def finish(self):
        return self.run.finish()

    def _numbers(self, metrics: Mapping[str, Any], prefix: str, out: dict) -> dict:
        for key, value in metrics.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                self._numbers(value, name + "/", out)
            elif hasattr(value, "bucket_counts") and hasattr(value, "bucket_limits"):  # a Levanter Histogram
                out[name] = value  # its buckets as they are: a `histogram` event (runledger.values)
                for stat in HISTOGRAM_STATS:
                    self._number(f"{name}/{stat}", getattr(value, stat), out)
            else:
                self._number(name, value, out)
        return out

    def _number(self, name: str, value: Any, out: dict) -> None:
        if type(value) is float:
            out[name] = value
        elif isinstance(value, numbers.Real) or getattr(value, "shape", None) == ():
            try:
                out[name] = float(value)
            except (TypeError, ValueError):
                self._leave_out(name, value)
        else:
            self._leave_out(name, value)

    def _scalars(self, metrics: Mapping[str, Any], prefix: str, out: dict) -> dict:
        for key, value in metrics.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                self._scalars(value, name + "/", out)
            elif value is None or isinstance(value, (str, bool, numbers.Real)) or getattr(value, "shape", None) == ():
                out[name] = value.item() if hasattr(value, "item") else value
            else:
                self._leave_out(name, value)
        return out

    def _leave_out(self, name: str, value: Any) -> None:
        if name not in self._left_out:
            self._left_out.add(name)
            log.warning("run %s: %r is a %s, not a number: not recorded (this warning is given once per name)",
                        self.run.run_id, name, type(value).__name__)


def _content_of(path: str) -> dict:
    """{"bytes", "sha256"} of a local file; of a directory, with "files", the sha256 of its manifest
    (`runledger.content.content_of`); {"sha256": None} for a path that is not on this machine."""
    if "://" in path or not Path(path).exists():
        log.warning("artifact %s is not on this machine: recorded by its path only", path)
        return {"sha256": None}
    return content_of(path)


def _primary() -> bool:
    """Whether this is JAX process 0 (or JAX is not in use): the process that records."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


def _register(cls):
    return _TrackerConfig.register_subclass("runledger")(cls) if _TrackerConfig is not None else cls


@_register
@dataclasses.dataclass
class RunledgerConfig(*((_TrackerConfig,) if _TrackerConfig is not None else ())):
    """`tracker: {type: runledger, ...}`: where and as what the trainer's run is recorded."""

    project: Optional[str] = "levanter"
    name: Optional[str] = None  # shown as the run's name; the run id is `id`, else the trainer's, made valid
    id: Optional[str] = None
    tags: List[str] = dataclasses.field(default_factory=list)
    root: Optional[str] = None  # the ledger root: $RUNLEDGER_ROOT, else this user's (settings.user_root)
    nats: Optional[str] = None  # a NATS server instead of the root's embedded one ($RUNLEDGER_NATS)
    resume: Optional[Union[bool, str]] = "allow"  # a restarted trainer goes on with its run as the next attempt
    producer: str = PRODUCER
    system_metrics: Union[bool, float] = True  # sample the machine every 10 s (a number: that many seconds)
    mode: str = "online"  # "disabled": record nothing

    def init(self, run_id: Optional[str]) -> RunledgerTracker:
        given = self.id or run_id
        run = runledger.init(project=self.project, name=self.name, config={}, tags=list(self.tags),
                             resume=self.resume, id=run_id_for(given, self.project) if given else None,
                             root=self.root, nats=self.nats, producer=self.producer,
                             system_metrics=self.system_metrics, mode=self.mode if _primary() else "disabled")
        return RunledgerTracker(run)
