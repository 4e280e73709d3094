"""Import speed: a 100k-step, 20-metric TensorBoard run and an MLflow run brought into the ledger, events/s, in one command.

    python -m bench.import [--tb-steps 100000] [--mlflow-steps 20000] [--metrics 20] [--cache DIR]
    python -m bench.import --only images [--image-steps 320]

  read (own library)  the baseline: the source read whole with its own library and nothing else
                      (TensorBoard: every record of every event file parsed as an Event by tensorboard's
                      EventFileLoader; MLflow: MlflowClient.get_metric_history of every key)
  read (raw records)  TensorBoard only: its RawEventFileLoader's records parsed as Events, without the
                      loader's conversion of each event (the floor for a reader using its record reader)
  read (importer)     runledger.interop.importers.*.read: the same reading plus the events made of it
  import              `runledger import`'s work, read to stored: the reading, the comparison with the
                      ledger (nothing held yet), the emit through the Emitter's spool and JetStream, and
                      the ledger service's confirmation that it stored every event (the root's embedded
                      local server and ledger, started before the clock)
  re-import           the same again: the comparison finds every event held and emits nothing

images (`--only images`): a TensorBoard run as PyTorch's SummaryWriter writes one with add_image, per step
a `loss` scalar and a 256x256 noise PNG (about 200 KB a record; 320 steps make about 63 MB), each way
of reading it timed in a child process of its own, with that child's peak RSS (ru_maxrss) and its growth
over the child's RSS once its libraries are imported:
  tb accumulator      TensorBoard's EventAccumulator, every tag kept (size_guidance 0), Reload()
  tb loader           TensorBoard's EventFileLoader (what summary_iterator does: every record parsed)
  runledger read      runledger.interop.importers.read_source (CRC-checked, image records skipped)
  runledger import    the whole `runledger import`: read, compared, emitted and confirmed stored (the
                      root's local server and ledger started before the clock, in their own processes)

events/s counts ledger events (one `metrics` event per step holding its 20 values); points/s counts
scalars. The sources are made once by the peers' own writers (TensorBoard's EventFileWriter writing one
scalar per record, as PyTorch's add_scalar does; MLflow's file store through MlflowClient.log_batch) and
kept under --cache: writing them takes minutes (about 100 µs a scalar for either library here), which
is why the MLflow run is smaller by default (MLflow's sqlite store needs alembic, which is not in the
import extra).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger("bench.import")

WALL0 = 1_790_000_000.0  # the sources' first timestamp (seconds)
STEP_S = 0.5  # seconds between steps in the sources' timestamps
BATCH_STEPS = 500  # MLflow log_batch: steps per call (1,000 metrics is MLflow's batch limit)


def value(step: int, i: int) -> float:
    """A deterministic value of metric i at step (any float; float32-rounded by TensorBoard)."""
    return ((step * 2654435761 + i * 40503) % 1_000_003) / 1_000_003.0 * (i + 1)


def make_tensorboard(folder: Path, steps: int, metrics: int) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder), max_queue_size=100_000, flush_secs=120)
    names = [f"train/metric_{i:02d}" for i in range(metrics)]
    for step in range(steps):
        wall = WALL0 + step * STEP_S
        for i, name in enumerate(names):
            writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=name, simple_value=value(step, i))])))
    writer.close()


def make_mlflow(folder: Path, steps: int, metrics: int) -> str:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=folder.as_uri())
    run_id = client.create_run(client.create_experiment("bench-import"), start_time=int(WALL0 * 1000)).info.run_id
    for s0 in range(0, steps, BATCH_STEPS):
        client.log_batch(run_id, metrics=[Metric(f"train/metric_{i:02d}", value(s, i), int((WALL0 + s * STEP_S) * 1000), s)
                                          for s in range(s0, min(steps, s0 + BATCH_STEPS)) for i in range(metrics)])
    client.set_terminated(run_id, "FINISHED", end_time=int((WALL0 + steps * STEP_S) * 1000))
    return run_id


def source(cache: Path, kind: str, steps: int, metrics: int) -> Path:
    """The cached source (made on first use)."""
    folder = cache / f"{kind}-{steps}x{metrics}"
    done = folder / ".complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        started = time.monotonic()
        log.info("making the %s source (%d steps x %d metrics) in %s", kind, steps, metrics, folder)
        (make_tensorboard if kind == "tensorboard" else make_mlflow)(folder / "run", steps, metrics)
        done.write_text(f"{time.monotonic() - started:.1f}")
    return folder / "run"


def image_source(cache: Path, steps: int) -> Path:
    """The cached image run (made on first use)."""
    folder = cache / f"images-{steps}x{IMAGE_SIZE}"
    if not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        log.info("making the image source (%d steps of %dx%d images) in %s", steps, IMAGE_SIZE, IMAGE_SIZE, folder)
        make_images(folder / "run", steps)
        (folder / ".complete").write_text("")
    return folder / "run"


def read_raw(where: Path) -> int:
    """TensorBoard's records read and parsed as Events, without EventFileLoader's per-event conversion to
    tensors (the floor of any reader in Python using its record reader); returns the scalars read."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    from runledger.interop.importers.tensorboard import event_files

    return sum(len(event_pb2.Event.FromString(r).summary.value) for f in event_files(where)
               for r in RawEventFileLoader(str(f)).Load())


def read_own(kind: str, where: Path) -> int:
    """The baseline: the source read with its own library; returns the scalars read."""
    if kind == "tensorboard":
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        from runledger.interop.importers.tensorboard import event_files

        n = 0
        for f in event_files(where):
            for event in EventFileLoader(str(f)).Load():
                n += len(event.summary.value)
        return n
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=where.as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == "bench-import"]
    (run,) = client.search_runs([exp.experiment_id])
    return sum(len(client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics)


IMAGE_SIZE = 256  # pixels a side: a 256x256x3 noise PNG is about 197 KB


def make_images(folder: Path, steps: int) -> None:
    import io

    import numpy as np
    from PIL import Image
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    rng = np.random.default_rng(0)
    writer = EventFileWriter(str(folder))
    for step in range(steps):
        png = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)).save(png, format="PNG")
        image = summary_pb2.Summary.Image(height=IMAGE_SIZE, width=IMAGE_SIZE, colorspace=3, encoded_image_string=png.getvalue())
        for v in (summary_pb2.Summary.Value(tag="loss", simple_value=value(step, 0)),
                  summary_pb2.Summary.Value(tag="samples", image=image)):
            writer.add_event(event_pb2.Event(wall_time=WALL0 + step * STEP_S, step=step, summary=summary_pb2.Summary(value=[v])))
    writer.close()


IMAGE_READERS = {  # (setup, timed) code run in a child: `where` is the run folder, `n` the scalars read
    "tb accumulator": ("from tensorboard.backend.event_processing.event_accumulator import EventAccumulator",
                       "acc = EventAccumulator(where, size_guidance={'scalars': 0, 'images': 0, 'tensors': 0}); "
                       "acc.Reload(); n = len(acc.Scalars('loss'))"),
    "tb loader": ("from tensorboard.backend.event_processing.event_file_loader import EventFileLoader\n"
                  "from runledger.interop.importers.tensorboard import event_files",
                  "n = sum(1 for f in event_files(Path(where)) for e in EventFileLoader(str(f)).Load() "
                  "for v in e.summary.value if v.tag == 'loss')"),
    "runledger read": ("from runledger.interop.importers import read_source",
                       "n = sum(len(e.payload['metrics']) for e in read_source('tensorboard', where).events if e.kind == 'metrics')"),
    "runledger import": ("from runledger.interop.importers import read_source\nfrom runledger.interop.importers.bring import bring\n"
                         "from ledger import local\nattachment = local.attach(root)",
                         "run = read_source('tensorboard', where); done = bring(run, root, attachment.url); "
                         "assert done.confirmed; n = sum(len(e.payload['metrics']) for e in run.events if e.kind == 'metrics')"),
}
CHILD = """
import json, resource, sys, time
from pathlib import Path
where, root = sys.argv[1], sys.argv[2]
{setup}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
{timed}
s = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"s": s, "n": n, "peak_mib": peak / 1024, "grew_mib": (peak - base) / 1024}}))
"""


def measure_images(where: Path, root: Path) -> dict:
    """Each reader of the image run in a child process: seconds, peak RSS, growth (see the docstring)."""
    import sys

    size_mb = sum(p.stat().st_size for p in where.rglob("*tfevents*")) / 1e6
    out = {"source": "tensorboard images", "file_mb": round(size_mb, 1)}
    for name, (setup, timed) in IMAGE_READERS.items():
        child = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, timed=timed), str(where), str(root)],
                               capture_output=True, text=True, check=True)
        r = json.loads(child.stdout.strip().splitlines()[-1])
        out[name] = {"s": round(r["s"], 2), "scalars": r["n"], "peak_rss_mib": round(r["peak_mib"]),
                     "rss_growth_mib": round(r["grew_mib"])}
    own = out["tb loader"]["s"]
    out["runledger read / tb loader"] = round(out["runledger read"]["s"] / own, 2)
    out["runledger import / tb loader"] = round(out["runledger import"]["s"] / own, 2)
    out["runledger read / tb accumulator"] = round(out["runledger read"]["s"] / out["tb accumulator"]["s"], 2)
    out["load"] = load()
    return out


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1].strip()


def measure(kind: str, where: Path, root: Path, url: str) -> dict:
    from runledger.interop.importers import read_source
    from runledger.interop.importers.bring import bring

    t0 = time.perf_counter()
    points = read_own(kind, where)
    own_s = time.perf_counter() - t0
    raw_s = None
    if kind == "tensorboard":
        t0 = time.perf_counter()
        assert read_raw(where) == points
        raw_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = read_source(kind, str(where))
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = bring(run, root, url)
    bring_s = time.perf_counter() - t0
    assert done.confirmed and done.emitted == len(run.events), done.line()
    t0 = time.perf_counter()
    again = bring(read_source(kind, str(where)), root, url)
    again_s = time.perf_counter() - t0
    assert again.emitted == 0, again.line()
    from runledger import queries

    con = queries.connect(root)
    stored = con.execute("select count(*) from metrics_all where run_id = ?", [done.run_id]).fetchall()[0][0]
    con.close()
    assert stored == points, (stored, points)
    total = read_s + bring_s
    return {"source": kind, "points": points, "events": done.emitted, "own_read_s": round(own_s, 2),
            "own_read_points_per_s": round(points / own_s),
            "raw_read_s": None if raw_s is None else round(raw_s, 2), "importer_read_s": round(read_s, 2), "import_s": round(total, 2),
            "import_events_per_s": round(done.emitted / total), "import_points_per_s": round(points / total),
            "import_over_own_read": round(total / own_s, 2), "reimport_s": round(again_s, 2), "stored_points": stored,
            "load": load()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tb-steps", type=int, default=100_000)
    p.add_argument("--mlflow-steps", type=int, default=20_000)
    p.add_argument("--metrics", type=int, default=20)
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "runledger-bench-import")
    p.add_argument("--only", default="tensorboard,mlflow", help="tensorboard, mlflow and/or images")
    p.add_argument("--image-steps", type=int, default=320)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only when asked
    from runledger.ledger import local

    steps = {"tensorboard": args.tb_steps, "mlflow": args.mlflow_steps}
    only = args.only.split(",")
    sources = {k: source(args.cache, k, steps[k], args.metrics) for k in only if k != "images"}
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        root = Path(tmp) / "ledger"
        if "images" in only:
            print(json.dumps(measure_images(image_source(args.cache, args.image_steps), root)))
        attachment = local.attach(root)  # the local server and ledger up before any clock starts
        try:
            for kind, where in sources.items():
                result = measure(kind, where, root, attachment.url)
                result["steps"], result["metrics"] = steps[kind], args.metrics
                print(json.dumps(result))
        finally:
            attachment.release()
            local.down(root)


if __name__ == "__main__":
    main()
