"""`runledger import`: runs made by TensorBoard's writer, MLflow and W&B are imported through the real NATS and
ledger, every value compared with what was logged; a second import stores nothing; a grown source adds only
its new points; a changed source is refused, never forked.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from support.importers import write_tensorboard

# ------------------------------------------------------------------------------------ TensorBoard


def points(run) -> int:
    return sum(len(e.payload["metrics"]) for e in run.events if e.kind == "metrics")


def tensorboards_records(path: Path) -> list[bytes]:
    """The records TensorBoard's own record reader returns (its CRC-checked pure-Python reader)."""
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    reader, out = pywrap_tensorflow.PyRecordReader_New(str(path).encode()), []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return out
        except errors.DataLossError as err:
            if "truncated" in str(err):
                return out
            raise
        out.append(reader.record())


def test_event_files_are_read_as_tensorboards_reader_reads_them_and_a_torn_end_waits(tmp_path):
    from runledger.interop.importers import tensorboard as tb
    from runledger.interop.importers import tfrecord

    logdir = tmp_path / "tb"
    write_tensorboard(logdir, range(300), np.random.default_rng(2))
    files = tb.event_files(logdir)
    assert len(files) == 2 and all(list(tfrecord.records(f)) == tensorboards_records(f) for f in files)
    whole = tb.read(logdir)
    f = sorted(logdir.glob("*tfevents*"))[0]
    for cut in (1, 7, 13, 30):  # the last record cut short anywhere: a writer mid-write
        (tmp_path / "cut").write_bytes(f.read_bytes()[:-cut])
        assert list(tfrecord.records(tmp_path / "cut")) == tensorboards_records(tmp_path / "cut")
    for at in (0, 9, 200, len(f.read_bytes()) - 3):  # a flipped byte in a length, its crc, data, the last crc
        data = bytearray(f.read_bytes())
        data[at] ^= 0x20
        (tmp_path / "bad").write_bytes(bytes(data))
        with pytest.raises(tfrecord.CorruptRecord, match="crc32c"):
            list(tfrecord.records(tmp_path / "bad"))
        with pytest.raises(Exception, match="crc32 check"):  # (TensorBoard's reader refuses it too)
            tensorboards_records(tmp_path / "bad")
    f.write_bytes(f.read_bytes()[:-7])
    torn = tb.read(logdir)
    assert points(torn) == points(whole) - 1 and torn.events[1] == whole.events[1]
    data = bytearray(f.read_bytes())
    data[200] ^= 0x20
    f.write_bytes(bytes(data))
    with pytest.raises(tb.SourceError, match="corrupt"):
        tb.read(logdir)


def test_a_wandb_file_with_a_bad_checksum_is_refused(tmp_path):
    from runledger.interop.importers import wandb as wb

    f = tmp_path / "run-x.wandb"
    body = b"\x00" * 20
    f.write_bytes(b":W&B" + struct.pack("<HB", 0xBEE1, 0) + struct.pack("<IHB", 12345, len(body), 1) + body + b"\x00" * 64)
    with pytest.raises(wb.SourceError, match="checksum"):
        wb.read(f)


# ------------------------------------------------------------------------------------ the rules of a re-import


def test_a_reimport_plans_only_what_follows_the_held_events_and_refuses_a_changed_past():
    from runledger.interop.importers.bring import Held, ImportRefused, plan
    from runledger.interop.importers.source import SourceEvent, SourceRun, run_finished, run_started
    from runledger.ledger.contract.canonical import canonical_json

    def source(n: int, uri: str = "/runs/a", loss0: float = 1.0) -> list[SourceEvent]:
        run = SourceRun("tensorboard", "a", uri, "tb-a")
        points = [SourceEvent("metrics", {"metrics": {"loss": loss0 / (k + 1)}}, k, f"2026-01-01T00:00:{k:02d}.000000Z")
                  for k in range(n)]
        return [run_started(run, "2026-01-01T00:00:00.000000Z", {}), *points,
                run_finished("completed", f"2026-01-01T00:00:{n:02d}.000000Z", points)]

    def held(events: list[SourceEvent], seq0: int = 0) -> list[Held]:
        return [Held(i, e.kind, e.step, e.time, canonical_json(e.payload), f"{i:064x}", {})
                for i, e in enumerate(events, start=seq0)]

    first = source(5)
    assert plan([], first, "tb-a") == first
    assert plan(held(first), source(5), "tb-a") == []  # the same source again: nothing
    assert plan(held(first), source(5, uri="/moved/a"), "tb-a") == []  # the same source, moved: nothing
    grown = source(8)
    assert plan(held(first), grown, "tb-a") == grown[6:]  # 3 new points and the new end
    after = held(first) + held(grown[6:], len(first))  # as stored: the first end stays where it was
    assert plan(after, source(8), "tb-a") == []
    with pytest.raises(ImportRefused, match="changed, not grew"):
        plan(held(first), source(5, loss0=2.0), "tb-a")
    with pytest.raises(ImportRefused, match="changed, not grew"):
        plan(held(first), source(3), "tb-a")  # points gone
