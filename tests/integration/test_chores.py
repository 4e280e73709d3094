"""The daily chores against a real server and ledger: `runs` lists one row per run, as stored; `du` counts
the bytes the files hold; `delete` removes a run the sanctioned way (a tombstone, then a rewrite commit
that names it), after which `verify` says ok and names the tombstone, every other run is untouched, and
anything removed by hand still fails `verify`."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

import runledger
from runledger.ledger import settings
from runledger.ledger.storage import removal
from runledger.ledger.storage.paths import event_files
from runledger.ledger.storage.store import tables_of
from support.processes import cli, verify
from support.reading import reader, wait_for_count


def log_run(project: str, name: str, steps: int, loss0: float, **init) -> str:
    run = runledger.init(project=project, name=name, system_metrics=False, **init)
    for step in range(steps):
        runledger.log({"loss": loss0 / (step + 1), "lr": 0.1})
    assert run.finish()
    wait_for_count(settings.root(), f"select count(*) from runs_finished where run_id = '{run.id}'", 1)
    return run.id


def stored(root, run_id: str) -> list[tuple]:
    """Every stored row of a run but its tombstones: (kind, event_id, hash)."""
    out = []
    for f in event_files(root, None, run_id):
        t = pq.read_table(f, columns=["kind", "event_id", "hash"])
        out += [(k, e, h) for k, e, h in zip(*(t.column(c).to_pylist() for c in ("kind", "event_id", "hash")))
                if k != removal.TOMBSTONE]
    return sorted(out)


def started_served(ledger_process, nats_server, root, monkeypatch) -> None:
    ledger_process.start()
    monkeypatch.setenv("RUNLEDGER_NATS", nats_server.url)
    monkeypatch.setenv("RUNLEDGER_ROOT", str(root))


def test_runs_lists_one_row_per_run_with_its_attempts_as_stored(ledger_process, nats_server, root, monkeypatch):
    started_served(ledger_process, nats_server, root, monkeypatch)
    a = log_run("vision", "baseline", 5, 2.0, id="a-run")
    again = runledger.init(project="vision", id="a-run", resume=True, system_metrics=False)  # a second attempt
    runledger.log({"loss": 0.25, "lr": 0.05}, step=5)
    assert again.finish()
    b = log_run("text", "baseline", 3, 4.0)

    r = cli("runs", "--root", str(root), "--json", "--limit", "0")
    assert r.returncode == 0, r.stderr
    rows = {x["run_id"]: x for x in json.loads(r.stdout)}
    assert set(rows) == {a, b}
    assert (rows[a]["project"], rows[a]["name"], rows[a]["state"], rows[a]["attempts"], rows[a]["steps"]) == \
        ("vision", "baseline", "finished", 2, 6)
    assert rows[a]["last_values"] == {"loss": 0.25, "lr": 0.05}
    assert (rows[b]["attempts"], rows[b]["steps"], rows[b]["last_values"]) == (1, 3, {"loss": 4.0 / 3, "lr": 0.1})
    starts = reader(root).execute("select run_id, min(ts) from runs group by run_id").fetchall()
    assert {k: str(v) for k, v in starts} == {k: v["started_at"] for k, v in rows.items()}

    only = json.loads(cli("runs", "--root", str(root), "--json", "--project", "text").stdout)
    assert [x["run_id"] for x in only] == [b]
    assert [x["run_id"] for x in json.loads(cli("runs", "--root", str(root), "--json", "--name", "baseline",
                                                "--limit", "1").stdout)] == [b]  # newest first
    assert json.loads(cli("runs", "--root", str(root), "--json", "--state", "running").stdout) == []
    table = cli("runs", "--root", str(root))
    assert table.returncode == 0 and a in table.stdout and "vision" in table.stdout and "loss=0.25" in table.stdout


def test_du_counts_the_bytes_of_each_runs_files(ledger_process, nats_server, root, monkeypatch):
    started_served(ledger_process, nats_server, root, monkeypatch)
    a = log_run("vision", "a", 50, 2.0)
    b = log_run("text", "b", 5, 2.0)
    r = cli("du", "--root", str(root), "--nats", nats_server.url, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    runs = {x["run_id"]: x for x in doc["runs"]}
    for run_id in (a, b):
        assert runs[run_id]["tables_bytes"] == sum(f.stat().st_size for f in event_files(root, None, run_id)) > 0
        assert runs[run_id]["stream_messages"] is not None
    assert {p["project"]: p["tables_bytes"] for p in doc["projects"]} == \
        {"vision": runs[a]["tables_bytes"], "text": runs[b]["tables_bytes"]}
    assert doc["total"]["tables_bytes"] == runs[a]["tables_bytes"] + runs[b]["tables_bytes"]
    assert doc["total"]["stream_bytes"] is not None
    assert doc["total"]["root_bytes"] >= doc["total"]["tables_bytes"] + doc["total"]["spool_bytes"]
    text = cli("du", "--root", str(root)).stdout
    assert "total: tables" in text and "vision" in text


def test_delete_leaves_a_tombstone_verify_names_and_other_runs_untouched(ledger_process, nats_server, root, monkeypatch):
    started_served(ledger_process, nats_server, root, monkeypatch)
    gone = log_run("p", "doomed", 20, 2.0)
    kept = log_run("p", "kept", 20, 3.0)
    kept_rows = stored(root, kept)
    assert stored(root, gone) and verify(root)[0] == 0

    r = cli("delete", gone, "--root", str(root), "--nats", nats_server.url, "--yes", "--reason", "a test")
    assert r.returncode == 0, r.stderr
    assert stored(root, gone) == []
    assert stored(root, kept) == kept_rows
    (t,) = removal.stored_tombstones(root, gone)
    assert t["producer"] == "cli" and t["payload"]["authority"] == "os_user" and t["payload"]["reason"] == "a test"
    assert t["event_id"] in r.stdout
    assert reader(root).execute(f"select count(*) from events where run_id = '{gone}' and kind <> 'tombstone'").fetchone() == (0,)
    assert reader(root).execute('select run_id, "by" from tombstones').fetchall() == [(gone, t["payload"]["by"])]
    snapshots = [s.summary.additional_properties for tb in (tables_of(root).table("metrics"),) for s in tb.snapshots()]
    assert {removal.TOMBSTONE_KEY: t["event_id"]}.items() <= snapshots[-1].items()  # the rewrite commit names it
    assert not list((settings.spool_dir(root) / gone).glob("*/*/seg-*"))

    rc, out = verify(root)
    assert rc == 0, out
    assert t["event_id"] in out and f"run {gone}" in out
    assert json.loads(cli("runs", "--root", str(root), "--json").stdout)[0]["run_id"] == kept

    for f in event_files(root, "metrics", kept):  # a file of another run deleted by hand: no tombstone covers it
        f.unlink()
    rc, out = verify(root)
    assert rc == 1 and kept in out, out


def test_rows_taken_out_by_hand_still_fail_verify_beside_a_tombstone(ledger_process, nats_server, root, monkeypatch):
    started_served(ledger_process, nats_server, root, monkeypatch)
    gone = log_run("p", "doomed", 5, 2.0)
    kept = log_run("p", "kept", 30, 3.0)
    assert cli("delete", gone, "--root", str(root), "--nats", nats_server.url, "--yes").returncode == 0
    (f,) = event_files(root, "metrics", kept)
    t = pq.read_table(f)
    pq.write_table(t.slice(0, t.num_rows - 3), f)  # the chain's last three events cut by hand
    rc, out = verify(root)
    assert rc == 1, out


def test_delete_by_name_and_by_project_on_the_embedded_default(local_root):
    one = log_run("alpha", "first", 3, 1.0)
    two = log_run("alpha", "second", 3, 1.0)
    other = log_run("beta", "first", 3, 1.0)

    ambiguous = cli("delete", "first", "--root", str(local_root), "--yes")
    assert ambiguous.returncode == 2 and one in ambiguous.stderr and other in ambiguous.stderr
    assert cli("delete", "second", "--root", str(local_root)).returncode == 2  # not a terminal, no --yes: refused
    r = cli("delete", "second", "--root", str(local_root), "--yes")
    assert r.returncode == 0 and two in r.stdout, r.stderr
    r = cli("delete", "--project", "alpha", "--root", str(local_root), "--yes")
    assert r.returncode == 0 and one in r.stdout, r.stderr
    assert [x["run_id"] for x in json.loads(cli("runs", "--root", str(local_root), "--json").stdout)] == [other]
    tombs = removal.stored_tombstones(local_root)
    assert sorted(t["run_id"] for t in tombs) == sorted([one, two])
    assert {t["payload"]["authority"] for t in tombs} == {"os_user"}
    rc, out = verify(local_root)
    assert rc == 0 and all(t["event_id"] in out for t in tombs), out


def test_du_counts_blobs_and_delete_removes_only_the_blobs_no_other_run_holds(ledger_process, nats_server, root, monkeypatch):
    import os
    import time

    import numpy as np

    from runledger.ledger.storage.media import blob_path

    started_served(ledger_process, nats_server, root, monkeypatch)
    shared, own = np.zeros((8, 8), dtype=np.uint8), np.full((8, 8), 200, dtype=np.uint8)
    doomed = log_run("p", "doomed", 1, 2.0, id="doomed")
    runledger.init(project="p", id="doomed-2", system_metrics=False)  # (a second run naming the shared image)
    runledger.log({"a": runledger.Image(shared)})
    assert runledger.finish()
    run = runledger.init(project="p", id="doomed", resume=True, system_metrics=False)
    runledger.log({"a": runledger.Image(shared), "b": runledger.Image(own)})
    assert run.finish()
    wait_for_count(root, "select count(*) from media", 3)
    digests = dict(reader(root).execute("select key, sha256 from media where run_id = 'doomed'").fetchall())
    sizes = {k: blob_path(root, d).stat().st_size for k, d in digests.items()}
    doc = json.loads(cli("du", "--root", str(root), "--json").stdout)
    runs = {x["run_id"]: x for x in doc["runs"]}
    assert runs[doomed]["media_bytes"] == sizes["a"] + sizes["b"] and runs["doomed-2"]["media_bytes"] == sizes["a"]
    assert (doc["total"]["media_blobs"], doc["total"]["media_bytes"]) == (2, sizes["a"] + sizes["b"])  # the shared one once
    old = time.time() - 3600  # (written an hour ago: no event of them can be on its way)
    for d in digests.values():
        os.utime(blob_path(root, d), (old, old))
    out = cli("delete", doomed, "--root", str(root), "--nats", nats_server.url, "--yes")
    assert out.returncode == 0, out.stderr
    assert "1 removed, 1 kept" in out.stdout
    assert not blob_path(root, digests["b"]).exists() and blob_path(root, digests["a"]).exists()  # doomed-2 holds it
    assert verify(root)[0] == 0
