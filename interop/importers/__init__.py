"""Importers: a run of TensorBoard, MLflow or W&B read with the peer's own reader and brought into the ledger once.

`read_source(kind, where)` reads a run (`source.SourceRun`: its events in a fixed order, with the
source's times), `bring.bring(run, root)` emits what the ledger does not hold yet, all of it or none.
The peers' libraries are the optional extra `runledger[import]`, imported only when their source is
read. A source that cannot be read whole (missing, unreadable, not the peer's format, corrupt) is a
`SourceError` with a one-line reason, whatever the peer's library raised.
"""

from __future__ import annotations

import logging

from runledger.interop.importers.bring import ImportRefused
from runledger.interop.importers.source import SourceError, SourceRun

__all__ = ["ImportRefused", "SourceError", "SourceRun", "read_source"]

log = logging.getLogger(__name__)


def read_source(kind: str, where: str, source_run: str | None = None) -> SourceRun:
    """The run at `where` (a folder, file or tracking URI) of source `kind`; `source_run` picks one run
    of a store that holds several. SourceError if it cannot be read whole."""
    try:
        return _read(kind, where, source_run)
    except (SourceError, ImportError):
        raise
    except PermissionError as err:
        raise SourceError(f"{err.filename or where}: permission denied (the import may not read its source)") from None
    except OSError as err:
        raise SourceError(f"{err.filename or where}: {err.strerror or type(err).__name__}") from None
    except Exception as err:  # the peer's library on a source it cannot read: its error, in one line
        log.debug("reading %s %s", kind, where, exc_info=True)
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        raise SourceError(f"{where} cannot be read as a {kind} run ({type(err).__name__}{': ' + first if first else ''})") \
            from None


def _read(kind: str, where: str, source_run: str | None) -> SourceRun:
    if kind == "tensorboard":
        from runledger.interop.importers import tensorboard

        if source_run is not None:
            raise SourceError("--source-run is for mlflow and wandb: a TensorBoard run is its folder")
        return tensorboard.read(where)
    if kind == "mlflow":
        from runledger.interop.importers import mlflow

        return mlflow.read(where, source_run)
    if kind == "wandb":
        from runledger.interop.importers import wandb

        return wandb.read(where, source_run)
    raise SourceError(f"unknown source {kind!r}: tensorboard, mlflow or wandb")
