"""Attacks on `runledger import`: hostile sources (huge image records, one bad point in the middle, garbage, a
wrong scheme, a FIFO, a file it may not read) against its promises: an import reads a record file at about
TensorBoard's own reader's cost in bounded memory, stores a run whole or not at all, and refuses a source it
cannot read in one line with exit 2, never a traceback or a hang.
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from support import REPO
from support.processes import cli
from support.reading import reader

WATCHDOG_S = 60  # a reading that takes longer than this is taken as hung (it takes about a second)
WALL0 = 1.7e9
YEAR_3000 = 32_503_680_000.0  # 3000-01-01T00:00:00Z in seconds: past the ledger's years


def all_counts(root: Path) -> dict[str, int]:
    try:
        return dict(reader(root).execute("select kind, count(*) from events group by kind").fetchall())
    except Exception:  # no ledger files at all: nothing was stored
        return {}


def refused_in_one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("runledger import: ") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.fixture
def watchdog():
    """A SIGALRM that breaks a hung import (a test fails rather than waits forever)."""
    def hung(*_):
        raise TimeoutError(f"the import did not answer in {WATCHDOG_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(WATCHDOG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------ image records (finding 11)


def png(rng: np.random.Generator, size: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def write_images(folder: Path, steps: int, rng: np.random.Generator, size: int = 256) -> None:
    """A run as PyTorch's SummaryWriter writes one: per step a `loss` scalar, a noise image (add_image: the
    `image` field) and a histogram, through TensorBoard's own EventFileWriter."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    for step in range(steps):
        wall = WALL0 + step
        image = summary_pb2.Summary.Image(height=size, width=size, colorspace=3, encoded_image_string=png(rng, size))
        histo = summary_pb2.HistogramProto(min=0.0, max=1.0, num=100, sum=50.0, sum_squares=30.0,
                                           bucket_limit=list(np.linspace(0, 1, 30)), bucket=[3.0] * 30)
        for value in (summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (step + 1)),
                      summary_pb2.Summary.Value(tag="samples", image=image),
                      summary_pb2.Summary.Value(tag="weights", histo=histo)):
            writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value])))
    writer.close()


def records_tensorboard_reads(path: Path) -> list[bytes]:
    """The records TensorBoard's own record reader returns."""
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    reader_, out = pywrap_tensorflow.PyRecordReader_New(str(path).encode()), []
    while True:
        try:
            reader_.GetNext()
        except errors.OutOfRangeError:
            return out
        out.append(reader_.record())


READ_IN_A_CHILD = """
import json, resource, sys
from runledger.interop.importers import tensorboard
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run = tensorboard.read(sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kib": after - before, "points": sum(len(e.payload["metrics"]) for e in run.events
                  if e.kind == "metrics"), "skipped": run.skipped}))
"""


def test_a_run_of_image_records_is_read_in_bounded_memory_skipping_what_is_not_a_scalar(tmp_path):
    from runledger.interop.importers import tfrecord

    small = tmp_path / "small"
    write_images(small, 4, np.random.default_rng(1))
    (f,) = small.glob("*tfevents*")
    assert list(tfrecord.records(f)) == records_tensorboard_reads(f)  # the records TensorBoard's reader returns
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x20  # a flipped byte inside an image
    f.write_bytes(bytes(data))
    with pytest.raises(tfrecord.CorruptRecord, match="crc32c"):
        list(tfrecord.records(f))

    big = tmp_path / "big"
    write_images(big, 160, np.random.default_rng(2))  # about 32 MB of 256x256 noise images
    size_kib = sum(p.stat().st_size for p in big.glob("*tfevents*")) // 1024
    try:
        child = subprocess.run([sys.executable, "-c", READ_IN_A_CHILD, str(big)], cwd=REPO, capture_output=True,
                               text=True, timeout=WATCHDOG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading a {size_kib // 1024} MB run of images took over {WATCHDOG_S} s")
    assert child.returncode == 0, child.stderr[-2000:]
    read = json.loads(child.stdout)
    assert read["points"] == 160 and read["skipped"] == {"image values": 160, "histo values": 160}
    assert read["grew_kib"] < size_kib / 2, f"reading {size_kib} KiB of records grew the reader by {read['grew_kib']} KiB"


# ------------------------------------------------------------------------------------ all or nothing (finding 17)


def write_scalars(folder: Path, steps: int, bad_at: int | None) -> None:
    """`loss` at each step through TensorBoard's EventFileWriter; at `bad_at`, a wall time in the year 3000."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder), filename_suffix="")
    for step in range(steps):
        wall = YEAR_3000 if step == bad_at else WALL0 + step
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (step + 1))])))
    writer.close()


def test_a_tensorboard_run_with_one_bad_point_in_the_middle_stores_nothing_then_whole(local_root, tmp_path):
    logdir = tmp_path / "tb" / "run-a"
    write_scalars(logdir, 40, bad_at=20)
    line = refused_in_one_line(cli("import", "tensorboard", str(logdir), "--root", str(local_root)))
    assert "3000" in line
    assert all_counts(local_root) == {}

    for f in logdir.glob("*tfevents*"):  # the source fixed: the same run, its point at its real time
        f.unlink()
    write_scalars(logdir, 40, bad_at=None)
    done = cli("import", "tensorboard", str(logdir), "--root", str(local_root))
    assert done.returncode == 0, done.stderr
    assert all_counts(local_root) == {"run_started": 1, "metrics": 40, "run_finished": 1}
    assert cli("verify", "--root", str(local_root)).returncode == 0


def test_an_mlflow_run_with_one_bad_point_in_the_middle_stores_nothing_then_whole(local_root, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.create_run(client.create_experiment("attack"), start_time=int(WALL0 * 1000))
    t0 = int(WALL0 * 1000)
    for step in range(30):
        at = int(YEAR_3000 * 1000) if step == 15 else t0 + step * 1000
        client.log_metric(run.info.run_id, "loss", 1.0 / (step + 1), timestamp=at, step=step)
    client.set_terminated(run.info.run_id, "FINISHED", end_time=t0 + 31_000)
    line = refused_in_one_line(cli("import", "mlflow", store.as_uri(), "--root", str(local_root)))
    assert "3000" in line
    assert all_counts(local_root) == {}

    history = next(store.glob(f"*/{run.info.run_id}/metrics/loss"))  # the file store's history, fixed in place
    history.write_text(history.read_text().replace(str(int(YEAR_3000 * 1000)), str(t0 + 15_000)))
    done = cli("import", "mlflow", store.as_uri(), "--root", str(local_root))
    assert done.returncode == 0, done.stderr
    assert all_counts(local_root) == {"run_started": 1, "metrics": 30, "run_finished": 1}
    assert cli("verify", "--root", str(local_root)).returncode == 0


def write_wandb(folder: Path, monkeypatch, bad_time: bool) -> Path:
    """A W&B offline run (id `attack-run`) of 20 steps and a config change; with `bad_time`, step 10 logged at a
    time in the year 3000."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(folder))
    folder.mkdir(parents=True)
    run = wandb.init(project="attack", id="attack-run", config={"lr": 3e-4}, dir=str(folder),
                     settings=wandb.Settings(console="off", save_code=False, disable_git=True, x_disable_stats=True))
    for step in range(20):
        at = {"_timestamp": YEAR_3000} if bad_time and step == 10 else {}
        run.log({"loss": 1.0 / (step + 1), **at}, step=step)
        if step == 10:
            run.config.update({"momentum": 0.9})
    run.finish()
    wandb.teardown()  # (W&B keeps its settings, WANDB_DIR among them, for the process: the next run gets its own)
    return next((folder / "wandb").glob("offline-run-*/run-*.wandb"))


def test_a_wandb_run_with_one_bad_value_in_the_middle_stores_nothing_then_whole(local_root, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    bad = write_wandb(tmp_path / "bad", monkeypatch, bad_time=True)
    assert "3000" in refused_in_one_line(cli("import", "wandb", str(bad), "--root", str(local_root)))
    assert all_counts(local_root) == {}

    fixed = write_wandb(tmp_path / "fixed", monkeypatch, bad_time=False)
    done = cli("import", "wandb", str(fixed), "--root", str(local_root))
    assert done.returncode == 0, done.stderr
    assert all_counts(local_root) == {"run_started": 1, "metrics": 20, "config": 1, "run_finished": 1}
    assert cli("verify", "--root", str(local_root)).returncode == 0


# ------------------------------------------------------------------------------------ hostile sources (finding 19)


def real_sources(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """One small real source of each kind, made by the peers' own writers (for truncating)."""
    from mlflow.tracking import MlflowClient

    tb = tmp_path / "real-tb"
    write_scalars(tb, 5, bad_at=None)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "real-mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.create_run(client.create_experiment("real"))
    client.log_metric(run.info.run_id, "loss", 0.5, step=0)
    # a W&B run file: its header and a first record, as the log writes them
    body = b"\x00" * 40
    wb = tmp_path / "real-wandb" / "run-x.wandb"
    wb.parent.mkdir()
    crc = zlib.crc32(body, zlib.crc32(bytes([1]))) & 0xFFFFFFFF
    wb.write_bytes(b":W&B" + struct.pack("<HB", 0xBEE1, 0) + struct.pack("<IHB", crc, len(body), 1) + body)
    return {"tensorboard": next(tb.glob("*tfevents*")), "mlflow": next(store.glob(f"*/{run.info.run_id}/meta.yaml")),
            "wandb": wb}


HOSTILE = ["missing", "empty file", "garbage", "truncated", "wrong scheme", "empty folder", "fifo", "garbage folder",
           "garbage record"]


def hostile(case: str, kind: str, tmp_path: Path, monkeypatch) -> str:
    """The source `case` for importer `kind`: a path or URI to give `runledger import`."""
    where = tmp_path / "src"
    where.mkdir()
    garbage = np.random.default_rng(7).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    name = {"tensorboard": "events.out.tfevents.1.host.1.1", "mlflow": "store.db", "wandb": "run-x.wandb"}[kind]
    if case == "missing":
        return str(where / "nothing-here")
    if case == "empty file":
        (where / name).write_bytes(b"")
        return str(where / name)
    if case == "garbage":
        (where / name).write_bytes(garbage)
        return str(where / name)
    if case == "garbage folder":  # the file a folder's reader picks, holding garbage
        (where / name).write_bytes(garbage)
        return str(where)
    if case == "truncated":
        real = real_sources(tmp_path, monkeypatch)[kind]
        real.write_bytes(real.read_bytes()[:10])
        return str(real.parent)
    if case == "garbage record":  # a real source whose record is garbage that passes its framing's checks
        real = real_sources(tmp_path, monkeypatch)[kind]
        if kind == "tensorboard":  # a record whose CRCs are right and whose data is no Event
            from runledger.interop.importers.tfrecord import masked_crc32c

            data = garbage[:300]
            n = struct.pack("<Q", len(data))
            crc = [int(masked_crc32c(np.frombuffer(b, np.uint8)[None, :])[0]) for b in (n, data)]
            real.write_bytes(n + struct.pack("<I", crc[0]) + data + struct.pack("<I", crc[1]))
        elif kind == "mlflow":
            real.write_bytes(b"\x00: [unclosed\n" + garbage[:200])
        else:
            body = garbage[:300]
            crc = zlib.crc32(body, zlib.crc32(bytes([1]))) & 0xFFFFFFFF
            real.write_bytes(b":W&B" + struct.pack("<HB", 0xBEE1, 0) + struct.pack("<IHB", crc, len(body), 1) + body)
        return str(real.parent)
    if case == "wrong scheme":
        return "bogus://x/y"
    if case == "empty folder":
        return str(where)
    if case == "fifo":
        os.mkfifo(where / name)
        return str(where / name)
    raise AssertionError(case)


@pytest.mark.parametrize("kind", ["tensorboard", "mlflow", "wandb"])
@pytest.mark.parametrize("case", HOSTILE)
def test_a_source_that_cannot_be_read_is_refused_in_one_line(kind, case, tmp_path, monkeypatch, watchdog):
    pytest.importorskip({"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}[kind])
    root = tmp_path / "root"
    src = hostile(case, kind, tmp_path, monkeypatch)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    refused_in_one_line(cli("import", kind, src, "--root", str(root)))
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.is_relative_to(root))
    assert after == [p for p in before if not (tmp_path / p).is_relative_to(root)]  # nothing written to the source


def test_a_missing_mlflow_file_store_is_refused_not_made(tmp_path, watchdog):
    pytest.importorskip("mlflow")
    where = tmp_path / "no" / "store"
    refused_in_one_line(cli("import", "mlflow", where.as_uri(), "--root", str(tmp_path / "root")))
    assert not (tmp_path / "no").exists()


def test_an_mlflow_server_that_does_not_answer_is_refused_in_one_line(tmp_path, watchdog):
    pytest.importorskip("mlflow")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused_in_one_line(cli("import", "mlflow", f"http://127.0.0.1:{port}", "--root", str(tmp_path / "root")))


def without_root_powers() -> None:
    """In the child, before it runs the CLI: drop the capabilities that let root read any file (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH) from the bounding set, so the new program runs with them gone."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


@pytest.mark.parametrize("kind", ["tensorboard", "mlflow", "wandb"])
def test_a_source_the_user_may_not_read_is_refused_in_one_line(kind, tmp_path, monkeypatch):
    pytest.importorskip({"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}[kind])
    real = real_sources(tmp_path, monkeypatch)[kind]
    real.chmod(0)
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}
    try:
        for what in (real.parent, real.parent if kind == "tensorboard" else real):  # (a TensorBoard run is a folder)
            try:
                done = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "import", kind, str(what), "--root",
                                       str(tmp_path / "root")], cwd=REPO, capture_output=True, text=True,
                                      timeout=WATCHDOG_S, env=env, preexec_fn=without_root_powers)
            except subprocess.TimeoutExpired:
                pytest.fail(f"import {kind} {what} did not answer in {WATCHDOG_S} s")
            line = refused_in_one_line(done)
            assert "ermission" in line, line
            real.parent.chmod(0o300)  # then the folder, not listable either
    finally:
        real.parent.chmod(0o700)
        real.chmod(0o600)
