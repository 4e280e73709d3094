"""Lightning's logger: `Trainer(logger=RunledgerLogger(project="my-project"))` records the run in the ledger through
the public logging API (`runledger.init`, `Run.log`, `run.config.update`, `Run.log_checkpoint`, `Run.finish`).

What each call of the Trainer records (Lightning's `Logger` interface, `lightning.pytorch.loggers.Logger`):
- `experiment`, `version`: the `runledger.Run`, started on first use (`runledger.init`); `version` is its run id,
  so a ModelCheckpoint under this logger's folder is `{save_dir}/{name}/{run id}/checkpoints`.
- `log_hyperparams(params)`: `run.config.update(params)` (a Namespace as its dict): a `config` event.
- `log_metrics(metrics, step)`: `Run.log(metrics, step=step)`, names as Lightning gives them (with its `epoch`).
- `after_save_checkpoint(checkpoint_callback)`: `Run.log_checkpoint` of each checkpoint file the ModelCheckpoint
  holds (its latest, best and top-k) not recorded yet at that modification time, oldest first, at the last step
  logged: its bytes and SHA-256. (Lightning tells a logger after the save, so the save's seconds are null.)
- `finalize(status)`: `Run.finish`: "success" completed, "failed" failed, "finished" (a SLURM requeue) stopped.
  A later `fit`, `validate` or `test` of the same logger records as the run's next attempt.
Only global rank 0 records (`rank_zero_only`), as Lightning's own loggers do.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any, Mapping

from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

import runledger

STATUS = {"success": "completed", "failed": "failed", "finished": "stopped"}  # Lightning's -> run_finished's


class RunledgerLogger(Logger):
    """A Lightning logger recording into the ledger (see the module docstring for what each call records).

    project, name, tags, id, config: `runledger.init`'s (name: the run's display name; project: also the logger's
    `name`, the folder level Lightning puts under `save_dir`). save_dir: where Lightning writes this logger's files
    (checkpoints; default: the Trainer's default_root_dir), not the ledger's root, which is `root`
    (`runledger.init`'s, with nats, system_metrics and mode)."""

    def __init__(self, project: str | None = "lightning", name: str | None = None, tags: list[str] | None = None,
                 id: str | None = None, config: Mapping[str, Any] | None = None, *, save_dir: str | None = None,
                 root: str | None = None, nats: str | None = None, system_metrics: bool | float = True,
                 mode: str | None = None) -> None:
        super().__init__()
        self._project, self._name, self._tags, self._id = project, name, list(tags or []), id
        self._config = dict(config or {})
        self._save_dir = None if save_dir is None else str(save_dir)
        self._root, self._nats, self._system_metrics, self._mode = root, nats, system_metrics, mode
        self._run: runledger.Run | None = None
        self._recorded: dict[str, float] = {}  # checkpoint path -> the modification time recorded

    @property
    def name(self) -> str | None:
        return self._project

    @property
    def version(self) -> str | None:
        """The run id (the run is started for it on rank 0, unless it ran already; elsewhere the id given, if any)."""
        if self._run is not None:
            return self._run.run_id
        run = self.experiment
        return run.run_id if isinstance(run, runledger.Run) else self._id

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    @rank_zero_experiment
    def experiment(self) -> runledger.Run:
        """The run this logger records into: started on first use, and again (the next attempt) after a finalize."""
        if self._run is None or self._run.finished:
            again = self._run is not None
            self._run = runledger.init(project=self._project, name=self._name, config=self._config, tags=self._tags,
                                       id=self._run.run_id if again else self._id,
                                       resume="allow" if again or self._id else None, root=self._root, nats=self._nats,
                                       system_metrics=self._system_metrics, mode=self._mode)
            self._id = self._run.run_id
        return self._run

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        self.experiment.config.update(vars(params) if isinstance(params, Namespace) else dict(params))

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.experiment.log(dict(metrics), step=step)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        held = {getattr(checkpoint_callback, "last_model_path", ""), getattr(checkpoint_callback, "best_model_path", ""),
                *getattr(checkpoint_callback, "best_k_models", {})}
        files = sorted((Path(p).stat().st_mtime, p) for p in held if p and Path(p).is_file())
        for mtime, path in files:
            if self._recorded.get(path) != mtime:
                self.experiment.log_checkpoint(path)
                self._recorded[path] = mtime

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._run is not None and not self._run.finished:
            self._run.finish(STATUS.get(status, "completed"))
