"""TensorBoard event files read exactly into a `SourceRun`: every scalar at every step, float32 values as they were written.

The run is a folder: every `*tfevents*` file under it, in the order they were made (their names say
it: a restarted writer's new file comes after the old ones), each streamed record by record
(`runledger.interop.importers.tfrecord`: the records TensorBoard's own record reader returns, CRC-checked, at a
fraction of its time, in bounded memory; no sampling, unlike TensorBoard's `EventAccumulator`), each
parsed as TensorBoard's `Event` proto. A scalar is
either a `simple_value` (PyTorch's and tensorboardX's `add_scalar`) or a rank-0 tensor of the
`scalars` plugin (`tf.summary.scalar`, `tensorboard.summary.Writer`); a float32 becomes the Python
float of the same value (exact: every float32 is a float64), never via text. A file in a subfolder
prefixes its tags with that path (`validation/epoch_loss`, as Keras writes them). Hyperparameters
(the hparams plugin's session start, `add_hparams`, `hp.hparams`) become a `config` event where they
were written. Images, histograms, audio and text are not imported (counted in `skipped`). A record
that is not an Event, or a folder whose files hold no whole record, is refused (`SourceError`).

A record cut short at a file's end is a writer still writing: reading stops there, and the next
import takes it once written. A record whose checksum fails is corruption: the import is refused.
The order grows only at its end while one file at a time is appended to (the usual case, and every
finished run); a run whose several files all grew since the last import (train/ and validation/ of a
Keras run still going) reads as changed, and its re-import is refused until imported as a new run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from runledger.interop.importers import tfrecord
from runledger.interop.importers.source import (SourceError, SourceEvent, SourceRun, check_metric_name, check_step, grouped, run_finished, run_id_of, run_started, seconds_text)

SCALARS_PLUGIN = "scalars"
HPARAMS_PLUGIN = "hparams"
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64 = 1, 2, 3, 9  # tensorflow DataType enum values


def event_files(folder: Path) -> list[Path]:
    """The run's event files in the order they were made: by the time and the writer's file counter in
    their names (`events.out.tfevents.{time}.{host}.{pid}.{n}`), then their paths."""
    def refuse(err: OSError) -> None:  # a subfolder it may not list is part of the run: never skipped silently
        raise err

    found = [Path(top, name) for top, _, names in os.walk(folder, onerror=refuse) for name in names if "tfevents" in name]
    return sorted((p for p in found if p.is_file()), key=lambda p: (*_made(p.name), p.relative_to(folder).parts))


def _made(name: str) -> tuple[int, int]:
    parts = name.split(".")
    i = parts.index("tfevents") + 1 if "tfevents" in parts else len(parts)
    made = int(parts[i]) if i < len(parts) and parts[i].isdigit() else 0
    return made, int(parts[-1]) if parts[-1].isdigit() else 0


def events(path: Path) -> Iterator:
    """The `Event`s of one event file, streamed, CRC-checked, less a record cut short at its end."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    try:
        for i, data in enumerate(tfrecord.records(path)):
            try:
                yield event_pb2.Event.FromString(data)
            except DecodeError:
                raise SourceError(f"{path}: record {i} is not a TensorBoard event (not an event file?)") from None
    except tfrecord.CorruptRecord as err:
        raise SourceError(str(err)) from None


def _tensor_scalar(tensor) -> float | None:
    """A rank-0 numeric TensorProto's value as a Python float (exact for float32 and float64), else None."""
    if tensor.tensor_shape.dim:
        return None
    dtype = tensor.dtype
    if dtype == _DT_FLOAT and len(tensor.float_val) == 1:
        return tensor.float_val[0]  # (a float32 field: Python gets its exact float64)
    if dtype == _DT_DOUBLE and len(tensor.double_val) == 1:
        return tensor.double_val[0]
    from tensorboard.util import tensor_util

    value = tensor_util.make_ndarray(tensor)
    if value.shape != () or value.dtype.kind not in "fiub":
        return None
    return float(value.item())


def _hparams(content: bytes) -> dict:
    """The hyperparameters of an hparams plugin summary (`add_hparams`, `hp.hparams`), {} if it holds none."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    if data.WhichOneof("data") != "session_start_info":
        return {}
    out = {}
    for name, v in sorted(data.session_start_info.hparams.items()):
        kind = v.WhichOneof("kind")
        out[name] = None if kind in (None, "null_value") else getattr(v, kind)
    return {k: v for k, v in out.items() if not isinstance(v, float) or v - v == 0.0}


def _merged(metrics: list[SourceEvent], configs: list[tuple[int, SourceEvent]]) -> list[SourceEvent]:
    """The metrics events with each hparams `config` event after the metrics events holding the points read
    before it (points are grouped into events in order, so the count of points places it)."""
    if not configs:
        return metrics
    out, seen, configs = [], 0, list(configs)
    for e in metrics:
        while configs and configs[0][0] <= seen:
            out.append(configs.pop(0)[1])
        out.append(e)
        seen += len(e.payload["metrics"])
    return out + [c for _, c in configs]


def read(folder: str | Path) -> SourceRun:
    """The TensorBoard run in `folder` (see the module docstring)."""
    folder = Path(folder).resolve()
    if folder.is_file():
        raise SourceError(f"{folder} is a file: give the TensorBoard run's folder (the one holding its event files)")
    files = event_files(folder) if folder.is_dir() else []
    if not files:
        raise SourceError(f"no TensorBoard event files (*tfevents*) under {folder}")
    run = SourceRun("tensorboard", folder.name, str(folder), run_id_of("tb", folder.name, files[0].name))
    points: list[tuple[int, float, str, float]] = []  # (step, wall time, name, value)
    first = last = None
    plugins: dict[str, str] = {}  # tag -> plugin, from the first summary of the tag that says it
    configs: list[tuple[int, SourceEvent]] = []  # hparams, each after the points read before it
    for path in files:
        rel = path.parent.relative_to(folder)
        prefix = "" if rel == Path(".") else f"{rel.as_posix()}/"
        for event in events(path):
            wall = event.wall_time
            first = wall if first is None else min(first, wall)
            last = wall if last is None else max(last, wall)
            if not event.HasField("summary"):
                continue
            step = None
            for value in event.summary.value:
                tag = prefix + value.tag
                if value.metadata.plugin_data.plugin_name:
                    plugins.setdefault(tag, value.metadata.plugin_data.plugin_name)
                field = value.WhichOneof("value")
                if value.metadata.plugin_data.plugin_name == HPARAMS_PLUGIN:
                    hparams = _hparams(value.metadata.plugin_data.content)
                    if hparams:
                        configs.append((len(points), SourceEvent("config", {"config": hparams}, None, seconds_text(wall))))
                    continue
                if field == "simple_value":
                    number = value.simple_value
                elif field == "tensor" and plugins.get(tag, SCALARS_PLUGIN) == SCALARS_PLUGIN:
                    number = _tensor_scalar(value.tensor)
                    if number is None:
                        run.skip(f"non-scalar tensors ({tag})")
                        continue
                else:
                    run.skip(f"{plugins.get(tag, field)} values")
                    continue
                if step is None:
                    step = check_step(event.step, f"{path} {tag}")
                points.append((step, wall, check_metric_name(tag), number))
    if first is None:
        raise SourceError(f"the event files under {folder} hold no whole event yet")
    metrics = grouped("metrics", points, seconds_text)
    run.events = [run_started(run, seconds_text(first), {}),
                  *_merged(metrics, configs),
                  run_finished("completed", seconds_text(last), metrics,
                               reason="imported from TensorBoard event files, which record no end: closed at the last event's time")]
    return run
