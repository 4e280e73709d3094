"""importers: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tensorboard(folder: Path, steps: range, rng: np.random.Generator, wall0: float = 1.7e9) -> dict:
    """Scalars as tf.summary writes them (tensor float32, `tensorboard.summary.Writer`) and, in a subfolder,
    as PyTorch's SummaryWriter does (`simple_value`, through TensorBoard's EventFileWriter); returns
    {(step, name): float32 value}."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb
    from tensorboard.summary import Writer
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logged = {}
    tf_style = Writer(str(folder))
    torch_style = EventFileWriter(str(folder / "eval"))
    for step in steps:
        for name in ("loss", "grad_norm", "lr"):
            value = np.float32(rng.standard_normal() * 10.0 ** rng.integers(-8, 8))
            tf_style.add_scalar(name, value, step, wall_time=wall0 + step * 0.25)
            logged[(step, name)] = value
        value = np.float32(np.nan if step == steps.start + 3 else rng.random())
        torch_style.add_event(event_pb2.Event(wall_time=wall0 + step * 0.25 + 0.1, step=step, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="accuracy", simple_value=float(value))])))
        logged[(step, "eval/accuracy")] = value
        if step == steps.start == 0:  # hyperparameters, as add_hparams / hp.hparams write them
            torch_style.add_event(event_pb2.Event(wall_time=wall0 + 0.2, step=0, summary=hparams_pb(HPARAMS)))
    tf_style.close()
    torch_style.close()
    return logged


HPARAMS = {"lr": 3e-4, "layers": 4, "optimizer": "adam", "warmup": True}
