"""Keras 3's callback (any backend): `model.fit(..., callbacks=[RunledgerCallback(project="my-project")])` records
the fit in the ledger through the public logging API (`runledger.init`, `Run.log`, `run.config.update`,
`Run.finish`), per epoch or per batch as asked.

What each event of `fit` records (the `keras.callbacks.Callback` hooks):
- `on_train_begin`: `runledger.init` (unless a run is current and `run=` gave it), with the config given plus
  {"keras": {"backend", "version"}, "fit": `fit`'s params (epochs, steps, verbose), "num_parameters",
  "optimizer": the optimizer's config}.
- log_freq="epoch" (the default): `on_epoch_end` logs the epoch's logs (as `History` keeps them: loss, metrics,
  val_*) at step = the epoch (0, 1, ...), each name as `epoch/NAME`.
- log_freq="batch", or a number N: `on_train_batch_end` logs every (N-th) batch's logs as `batch/NAME` at step =
  the batch's count from the start of `fit` (0, 1, ...), and each epoch's logs as `epoch/NAME` at the step of its
  last batch, so that both keep one step axis. (W&B's `WandbMetricsLogger` names them so too.)
- `on_train_end`: `Run.finish()` of a run this callback started.
"""

from __future__ import annotations

from typing import Any

import keras

import runledger


class RunledgerCallback(keras.callbacks.Callback):
    """Records a Keras `fit` in the ledger (see the module docstring for what each hook records).

    project, name, tags, id, config: `runledger.init`'s. log_freq: "epoch", "batch" or every N batches. run: a run
    already started to record into (not finished at the end). root, nats, system_metrics, mode: `runledger.init`'s."""

    def __init__(self, project: str | None = "keras", name: str | None = None, tags: list[str] | None = None,
                 id: str | None = None, config: dict | None = None, *, log_freq: str | int = "epoch",
                 run: runledger.Run | None = None, root: str | None = None, nats: str | None = None,
                 system_metrics: bool | float = True, mode: str | None = None) -> None:
        super().__init__()
        if log_freq not in ("epoch", "batch") and not (isinstance(log_freq, int) and log_freq > 0):
            raise ValueError(f"log_freq={log_freq!r}: 'epoch', 'batch' or a number of batches")
        self.every = None if log_freq == "epoch" else (1 if log_freq == "batch" else int(log_freq))
        self.project, self.name, self.tags, self.id, self.config = project, name, list(tags or []), id, dict(config or {})
        self.root, self.nats, self.system_metrics, self.mode = root, nats, system_metrics, mode
        self.run, self._own = run, run is None
        self._batches = 0  # batches seen since the start of fit: the step of batch logging

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._batches = 0
        facts: dict[str, Any] = {"keras": {"backend": keras.backend.backend(), "version": keras.__version__},
                                 "fit": dict(self.params or {})}
        if self.model is not None:
            facts["num_parameters"] = self.model.count_params()
            if getattr(self.model, "optimizer", None) is not None:
                facts["optimizer"] = self.model.optimizer.get_config()
        if self._own:
            self.run = runledger.init(project=self.project, name=self.name, config={**self.config, **facts},
                                      tags=self.tags, id=self.id, resume="allow" if self.id else None, root=self.root,
                                      nats=self.nats, system_metrics=self.system_metrics, mode=self.mode)
        else:
            self.run.config.update({**self.config, **facts})

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.every is not None and logs and self._batches % self.every == 0:
            self.run.log({f"batch/{k}": v for k, v in logs.items()}, step=self._batches)
        self._batches += 1

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs:
            step = epoch if self.every is None else max(self._batches - 1, 0)
            self.run.log({f"epoch/{k}": v for k, v in logs.items()}, step=step)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._own and self.run is not None and not self.run.finished:
            self.run.finish()
