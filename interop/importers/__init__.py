"""Importers: a run of TensorBoard, MLflow or W&B read with the peer's own reader and brought into the ledger once.

`read_source(kind, where)` reads a run (`source.SourceRun`: its events in a fixed order, with the
source's times), `bring.bring(run, root)` emits what the ledger does not hold yet. The peers'
libraries are the optional extra `runledger[import]`, imported only when their source is read.
"""

from __future__ import annotations

from interop.importers.bring import ImportRefused
from interop.importers.source import SourceError, SourceRun

__all__ = ["ImportRefused", "SourceError", "SourceRun", "read_source"]


def read_source(kind: str, where: str, source_run: str | None = None) -> SourceRun:
    """The run at `where` (a folder, file or tracking URI) of source `kind`; `source_run` picks one run
    of a store that holds several."""
    if kind == "tensorboard":
        from interop.importers import tensorboard

        if source_run is not None:
            raise SourceError("--source-run is for mlflow and wandb: a TensorBoard run is its folder")
        return tensorboard.read(where)
    if kind == "mlflow":
        from interop.importers import mlflow

        return mlflow.read(where, source_run)
    if kind == "wandb":
        from interop.importers import wandb

        return wandb.read(where, source_run)
    raise SourceError(f"unknown source {kind!r}: tensorboard, mlflow or wandb")
