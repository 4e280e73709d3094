"""What a user does with a run, on a warehouse in a bucket (a real Swift s3api server, tests/support/s3.py):
`runledger.log` with images and files, whose blobs go into the bucket beside the tables (none under the
root); the dashboard shows the run's series and serves its blobs from there; Polars and Daft read the
tables through the root's catalog (`tables.reading_catalog`); `runledger export` writes the run's files
with their manifest and the export verifies; `runledger du` counts the bucket's bytes per run; and
`runledger delete` stores a tombstone, takes the rows out, removes the blobs no other run holds, and the
expiry and its graveyard delete the files from the bucket once no reader may need them."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest

import runledger
from runledger import queries
from runledger.ledger.storage import media, objects, paths, removal, store
from runledger.ledger.storage import tables as tables_module
from support import s3
from support.processes import LedgerProcess, cli, verify, wait_serving
from support.processes import runledger as runledger_cli
from support.reading import wait_for_count
from support.s3 import swift  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not s3.available(), reason="no Swift for the S3 tests: `make s3` installs it")

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # (polars' own planner is a separate package)
STEPS = 12


@pytest.fixture
def served_bucket(swift, root, nats_server, tmp_path, monkeypatch):
    """`ledger serve --warehouse s3://...` on `root`, this process logging to it (RUNLEDGER_ROOT/NATS); the
    warehouse's URI."""
    for k, v in swift.credentials().items():
        monkeypatch.setenv(k, v)
    warehouse = f"s3://{swift.bucket(f'runs-{uuid.uuid4().hex[:12]}')}/tables"
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log", "--warehouse", warehouse).start()
    wait_serving(lp)
    monkeypatch.setenv("RUNLEDGER_NATS", nats_server.url)
    monkeypatch.setenv("RUNLEDGER_ROOT", str(root))
    yield warehouse
    lp.kill()
    store.forget_tables(root)


def bucket_files(swift, uri: str) -> dict[str, int]:
    """Every object under `uri`: its key under the warehouse -> its size."""
    from pyarrow import fs

    infos = swift.client().get_file_info(fs.FileSelector(uri.removeprefix("s3://"), recursive=True, allow_not_found=True))
    base = uri.removeprefix("s3://") + "/"
    return {i.path.removeprefix(base): i.size for i in infos if i.type == fs.FileType.File}


def logged_on_bucket(name: str, images: list[np.ndarray], notes=None) -> str:
    run = runledger.init(project="bucket", name=name, system_metrics=False)
    for step in range(STEPS):
        runledger.log({"loss": 2.0 / (step + 1), "lr": 0.1}, step=step)
    runledger.log({f"img{i}": runledger.Image(a) for i, a in enumerate(images)} | ({"notes": runledger.File(notes)} if notes else {}),
                  step=STEPS)
    assert run.finish()
    return run.id


def test_a_runs_blobs_dashboard_readers_export_and_du_on_the_bucket(swift, served_bucket, root, tmp_path):
    from support.ui import client

    shared, own = np.zeros((8, 8), dtype=np.uint8), np.full((8, 8), 200, dtype=np.uint8)
    notes = tmp_path / "notes.txt"
    notes.write_text("generation settings\n")
    a = logged_on_bucket("a", [shared, own], notes)
    b = logged_on_bucket("b", [shared])
    wait_for_count(root, "select count(*) from runs_finished", 2)
    con = queries.connect(root)
    blobs = dict(con.execute("select key || ':' || run_id, sha256 from media").fetchall())
    assert len(blobs) == 4 and len(set(blobs.values())) == 3  # (the shared image is one blob)

    # the blobs are in the bucket beside the tables, not under the root
    stored = bucket_files(swift, served_bucket)
    assert all(f"media/{d}" in stored for d in blobs.values()), sorted(stored)
    assert not (root / media.MEDIA_DIR).exists() and not list(root.rglob("*.parquet"))
    assert any(k.startswith("heads/run_id=") for k in stored)  # (the chain heads too)
    rc, out = verify(root)
    assert rc == 0 and "ok" in out, out

    # the dashboard: the run's series and its blobs, read from the bucket
    with client(root, "127.0.0.1") as c:
        series = c.get(f"/api/run/{a}/series?source=metrics&keys=loss").json()["keys"]["loss"]["0"]
        assert series[0] == list(range(STEPS)) and series[1][0] == 2.0
        digest = blobs[f"img1:{a}"]
        got = c.get(f"/api/run/{a}/media/{digest}")
        assert got.status_code == 200 and got.content == media.blob_path(root, digest).read_bytes()
        assert got.headers["content-type"] == "image/png"

    # Polars and Daft read the tables through the root's catalog (its warehouse's file IO), as the views do
    pl = pytest.importorskip("polars")
    daft = pytest.importorskip("daft")
    views = con.execute("select run_id, count(*), max(step) from events where kind = 'metrics' group by run_id "
                        "order by run_id").fetchall()
    metrics = tables_module.reading_catalog(root).load_table("runledger.metrics")
    polars = pl.scan_iceberg(metrics).group_by("run_id").agg(pl.len(), pl.col("step").max()).sort("run_id").collect().rows()
    df = daft.read_iceberg(metrics).groupby("run_id").agg(daft.col("event_id").count(), daft.col("step").max()) \
        .sort("run_id").to_pydict()
    assert views == sorted([(a, STEPS + 1, STEPS), (b, STEPS + 1, STEPS)])
    assert [tuple(r) for r in polars] == views
    assert list(zip(df["run_id"], df["event_id"], df["step"])) == views

    # export: the run's stored files, byte for byte, and a manifest the export is verified by
    out = tmp_path / "export"
    done = cli("export", a, "--root", str(root), "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = con.execute(f"select count(*) from events where run_id = '{a}'").fetchone()[0]
    assert json.loads(done.stdout)["events"] == rows > STEPS
    manifest = json.loads((out / "export.json").read_text())
    assert {f["path"].split("/run_id=")[1].split("/")[0] for f in manifest["files"]} == {a}
    assert all((out / f["path"]).stat().st_size == stored[f["path"]] for f in manifest["files"])  # (the same bytes)
    rc, text = verify(out)
    assert rc == 0, text

    # du: each run's bytes in the bucket (its data files, the blobs it names), the total blobs once
    doc = json.loads(cli("du", "--root", str(root), "--json").stdout)
    runs = {r["run_id"]: r for r in doc["runs"]}
    for run_id in (a, b):
        files = [str(f.relative_to(objects.ObjectPath(served_bucket))) for f in paths.event_files(root, None, run_id)]
        assert runs[run_id]["tables_bytes"] == sum(stored[f] for f in files) > 0
    sizes = {k: stored[f"media/{d}"] for k, d in blobs.items()}
    assert runs[a]["media_bytes"] == sizes[f"img0:{a}"] + sizes[f"img1:{a}"] + sizes[f"notes:{a}"]
    assert runs[b]["media_bytes"] == sizes[f"img0:{b}"]
    assert (doc["total"]["media_blobs"], doc["total"]["media_bytes"]) == (3, sum(stored[f"media/{d}"] for d in set(blobs.values())))


def test_delete_on_the_bucket_leaves_a_tombstone_and_its_files_go_once_no_reader_needs_them(swift, served_bucket, root,
                                                                                          nats_server, monkeypatch):
    shared, own = np.zeros((8, 8), dtype=np.uint8), np.full((8, 8), 200, dtype=np.uint8)
    doomed = logged_on_bucket("doomed", [shared, own])
    kept = logged_on_bucket("kept", [shared])
    wait_for_count(root, "select count(*) from runs_finished", 2)
    con = queries.connect(root)
    digests = dict(con.execute(f"select key, sha256 from media where run_id = '{doomed}'").fetchall())
    kept_rows = con.execute(f"select count(*) from events where run_id = '{kept}'").fetchone()
    doomed_files = {str(f) for f in paths.event_files(root, None, doomed)}
    assert doomed_files and all(f.startswith(served_bucket + "/") for f in doomed_files)

    r = runledger_cli("delete", doomed, "--root", str(root), "--nats", nats_server.url, "--yes", "--reason", "on the bucket",
                      env={"RUNLEDGER_MEDIA_GRACE_S": "0"})  # (an object's time cannot be set back: no wait for its grace)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 removed, 1 kept" in r.stdout, r.stdout  # (the shared image: the kept run names it)
    con = queries.connect(root)
    assert con.execute(f"select count(*) from events where run_id = '{doomed}' and kind <> 'tombstone'").fetchone() == (0,)
    assert con.execute(f"select count(*) from events where run_id = '{kept}'").fetchone() == kept_rows
    (t,) = removal.stored_tombstones(root, doomed)
    assert t["payload"]["reason"] == "on the bucket"
    stored = bucket_files(swift, served_bucket)
    assert f"media/{digests['img1']}" not in stored and f"media/{digests['img0']}" in stored
    # the rewritten run's old files stay for the readers of older snapshots (the graveyard), then go
    assert all(f.removeprefix(served_bucket + "/") in stored for f in doomed_files)
    monkeypatch.setattr(tables_module, "RETENTION_S", 0.0)
    t = tables_module.Tables(root, mark=False)
    t.expire(keep=1)
    t.sweep()
    stored = bucket_files(swift, served_bucket)
    left = [f for f in doomed_files if f.removeprefix(served_bucket + "/") in stored]
    assert not left, left
    rc, out = verify(root)
    assert rc == 0 and f"run {doomed}" in out, out


def test_the_embedded_default_keeps_its_tables_and_blobs_in_the_bucket(swift, local_root, monkeypatch):
    """`runledger.init()` with no server, $RUNLEDGER_WAREHOUSE naming a bucket: the root's supervisor (started by
    init, the object store's keys not in its environment: it reads the root's 0600 file) stores the run's events
    into the bucket's tables and the run's image beside them; nothing of them under the root; verify 0."""
    for k, v in swift.credentials().items():
        monkeypatch.setenv(k, v)
    warehouse = f"s3://{swift.bucket(f'embedded-{uuid.uuid4().hex[:12]}')}/tables"
    monkeypatch.setenv("RUNLEDGER_WAREHOUSE", warehouse)
    run_id = logged_on_bucket("embedded", [np.full((4, 4), 7, dtype=np.uint8)])
    assert wait_for_count(local_root, f"select count(*) from events where run_id = '{run_id}' and kind = 'metrics'",
                          STEPS + 1) == STEPS + 1
    stored = bucket_files(swift, warehouse)
    (digest,) = queries.connect(local_root).execute("select sha256 from media").fetchone()
    assert f"media/{digest}" in stored and any(k.endswith(".parquet") and f"run_id={run_id}/" in k for k in stored)
    assert not list(local_root.rglob("*.parquet")) and not (local_root / media.MEDIA_DIR).exists()
    assert oct((local_root / objects.CREDENTIALS_FILE).stat().st_mode & 0o777) == "0o600"
    supervisor = json.loads((local_root / "local" / "state.json").read_text())["pid"]
    assert s3.SECRET_KEY.encode() not in Path(f"/proc/{supervisor}/environ").read_bytes()
    rc, out = verify(local_root)
    assert rc == 0, out
