"""A W&B offline run (`wandb/offline-run-*/run-*.wandb`) read into a `SourceRun`: history, config, summary, system metrics.

The .wandb file is W&B's transaction log: a LevelDB-style log (a 7-byte header ":W&B", 0xBEE1,
version; 32 KiB blocks of chunks, each with a 7-byte header of CRC-32 over its type and data, length
and type FULL/FIRST/MIDDLE/LAST), each whole record a `wandb.proto.wandb_internal_pb2.Record` of the
W&B SDK. wandb 0.31 no longer ships its Python reader of that log (`wandb.sdk.internal.datastore`), so
its few lines are here, CRCs checked; the records are parsed with the SDK's own protobuf classes.

What becomes what: the `run` record is `run_started` (its config, tags, project, host, start time);
each `history` record a `metrics` event at its `_step` and `_timestamp` (nested keys joined with "/",
values decoded from their JSON: NaN and infinities kept as `nonfinite`; media and other non-numbers
are counted in `skipped`); each `stats` record a `system` event at its timestamp; a `config` record
after the start a `config` event; `summary` records folded into `run_finished`'s summary, written when
the `exit` record is there (at the last time the file records). A record cut short at the end is a
run still writing: reading stops there. The file is read a block at a time (never whole); a record
that is not a W&B record, or a value that is not JSON, is refused (`SourceError`).
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from runledger.interop.importers.source import (SourceError, SourceEvent, SourceRun, check_metric_name, check_step, metric_value, nanos_text, run_finished, run_id_of, run_started, seconds_text)

BLOCK = 32 * 1024  # the log's block size
HEADER = struct.Struct("<IHB")  # chunk: crc32, length, type
FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", 0xBEE1, version
MAGIC = (b":W&B", 0xBEE1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
INTERNAL = ("_step", "_timestamp", "_runtime")  # history keys W&B adds to every row


def run_file(where: str | Path, source_run: str | None) -> Path:
    """The .wandb file of `where`: the file itself, an offline run's folder, or a wandb/ folder (its
    one run, or `source_run`)."""
    path = Path(where).resolve()
    if path.is_file():
        return path
    found = [f for pattern in ("run-*.wandb", "*run-*/run-*.wandb", "wandb/*run-*/run-*.wandb")
             for f in sorted(path.glob(pattern)) if f.is_file()]  # (not a FIFO: reading one waits forever)
    if not found and path.is_dir():
        list(path.iterdir())  # (a folder it may not list: PermissionError, said in one line)
    if source_run is not None:
        found = [f for f in found if f.stem == f"run-{source_run}"]
    if len(found) != 1:
        which = ", ".join(f.stem[4:] for f in found[:3])
        raise SourceError(f"{where} holds {f'several W&B runs ({which}...)' if found else 'no W&B run file'}: "
                          "give a run's folder, its .wandb file, or --source-run ID")
    return found[0]


def records(path: Path):
    """The .wandb file's whole records (bytes), CRCs checked, read a block at a time; stops at a record
    cut short at the end."""
    with open(path, "rb") as f:
        block = f.read(BLOCK)
        if len(block) < FILE_HEADER.size or FILE_HEADER.unpack_from(block)[:2] != MAGIC:
            raise SourceError(f"{path} is not a W&B run file")
        base, pos, chunks = 0, FILE_HEADER.size, []
        while block:
            whole = len(block) == BLOCK
            following = f.read(BLOCK) if whole else b""
            while pos + HEADER.size <= len(block):
                crc, length, kind = HEADER.unpack_from(block, pos)
                if length == 0 and kind == 0:  # zeros to the block's end
                    break
                body = block[pos + HEADER.size:pos + HEADER.size + length]
                last = not following and pos + HEADER.size + length >= len(block)
                if len(body) < length and last:  # the writer has not finished it yet
                    return
                if len(body) < length or zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
                    if last:  # the last chunk, being written
                        return
                    raise SourceError(f"{path}: a record at byte {base + pos} fails its checksum (a corrupt run file)")
                chunks.append(body)
                pos += HEADER.size + length
                if kind in (FULL, LAST):
                    yield b"".join(chunks)
                    chunks = []
            base, pos, block = base + len(block), 0, following  # (a block's tail too small for a header is padding)


def _numbers(name: str, value, out: dict, skipped: SourceRun) -> None:
    """Put a decoded history value in `out` as numbers by name: a number as itself, a dict of numbers
    under name/key, anything else (media, strings, lists) counted as skipped."""
    if isinstance(value, bool):
        out[name] = float(value)
    elif isinstance(value, (int, float)):
        out[name] = float(value)
    elif isinstance(value, dict) and "_type" not in value:
        for k, v in value.items():
            _numbers(f"{name}/{k}", v, out, skipped)
    else:
        skipped.skip(f"non-numeric values ({value.get('_type') if isinstance(value, dict) else type(value).__name__})")


def _key(item) -> str:
    nested = getattr(item, "nested_key", None)  # (a stats item has none)
    return "/".join(nested) if nested else item.key


def _payload(values: dict[str, float]) -> dict:
    metrics, nonfinite = {}, {}
    for name in sorted(values):
        metric_value(values[name], metrics, nonfinite, check_metric_name(name))
    return {"metrics": metrics, **({"nonfinite": nonfinite} if nonfinite else {})}


def read(where: str | Path, source_run: str | None = None) -> SourceRun:
    """The W&B offline run at `where` (see the module docstring)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    path = run_file(where, source_run)
    record = pb.Record()
    run: SourceRun | None = None
    started: SourceEvent | None = None
    events: list[SourceEvent] = []
    summary: dict = {}
    exited = None
    last_time = None
    for i, data in enumerate(records(path)):
        try:
            record.ParseFromString(data)
        except DecodeError:
            raise SourceError(f"{path}: record {i} is not a W&B record (a corrupt run file)") from None
        which = record.WhichOneof("record_type")
        if which == "run" and run is None:
            r = record.run
            run = SourceRun("wandb", r.run_id, str(path), run_id_of("wandb", r.run_id))
            config = {u.key: json.loads(u.value_json) for u in r.config.update if u.key != "_wandb"}
            last_time = nanos_text(r.start_time.seconds, r.start_time.nanos)
            started = run_started(run, last_time, config, tags=list(r.tags), project=r.project or None,
                                  hardware={"host": r.host} if r.host else None,
                                  extra={k: v for k, v in (("entity", r.entity), ("group", r.run_group),
                                                           ("job_type", r.job_type), ("name", r.display_name)) if v})
        elif run is None:
            continue
        elif which == "history":
            items = {_key(i): json.loads(i.value_json) for i in record.history.item}
            values: dict[str, float] = {}
            for name, value in items.items():
                if name not in INTERNAL:
                    _numbers(name, value, values, run)
            step = items.get("_step", record.history.step.num)
            if "_timestamp" in items:
                last_time = seconds_text(items["_timestamp"])
            if values:
                events.append(SourceEvent("metrics", _payload(values), check_step(int(step), f"{path} history"), last_time))
        elif which == "stats":
            ts = record.stats.timestamp
            last_time = nanos_text(ts.seconds, ts.nanos)
            values = {}
            for i in record.stats.item:
                _numbers(_key(i), json.loads(i.value_json), values, run)
            if values:
                events.append(SourceEvent("system", _payload(values), None, last_time))
        elif which == "config":
            changes = {u.key: json.loads(u.value_json) for u in record.config.update if u.key != "_wandb"}
            if changes:
                events.append(SourceEvent("config", {"config": changes}, None, last_time))
        elif which == "summary":
            for u in record.summary.update:
                key = _key(u)
                if not key.startswith("_"):
                    summary[key] = json.loads(u.value_json)
            for u in record.summary.remove:
                summary.pop(_key(u), None)
        elif which == "exit":
            exited = record.exit
    if run is None:
        raise SourceError(f"{path} has no run record yet (a run just starting?)")
    run.events = [started, *events]
    if exited is not None:
        kept = {}
        for k, v in summary.items():
            if isinstance(v, (bool, str)) or v is None:
                kept[k] = v
            elif isinstance(v, (int, float)):
                kept[k] = float(v) if v - v == 0.0 else None
        status = "completed" if exited.exit_code == 0 else "failed"
        run.events.append(run_finished(status, last_time, events, summary=kept,
                                       reason=f"W&B exit code {exited.exit_code}, runtime {exited.runtime} s"))
    return run
