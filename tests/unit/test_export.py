"""`runledger export`: a Parquet export keeps every envelope column and the canonical payload text, so `runledger
verify` recomputes every hash from the export alone; one value edited, a chain cut short or a file planted in
it fails the check. CSV keeps the envelope and the payload text. Bad input is one line, exit 2."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runledger.ledger.contract.canonical import canonical_json, event_hash
from runledger.ledger.storage import paths
from runledger.ledger.storage.digest import with_digest
from runledger.ledger.storage.export import MANIFEST
from support.processes import cli
from support.runs import RUN, build_run, set_cell


@pytest.fixture
def exported(root, tmp_path):
    build_run(root)
    out = tmp_path / "export"
    done = cli("export", "--all", "--root", str(root), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return root, out, json.loads(done.stdout)


def exported_steps_file(out):
    (f,) = out.glob(f"events/kind=step/run_id={RUN}/*.parquet")
    return f


def rewrite_exported(path, change):
    """Rewrite an exported file with `change(table)` applied and the ledger's digest recomputed (the attacker
    knows the format), so that only what the hashes say can catch it."""
    table = pq.read_table(path)
    pq.write_table(with_digest(change(table.replace_schema_metadata(None))), path)


def test_a_parquet_export_verifies_from_its_own_files(exported):
    root, out, said = exported
    stored = sum(pq.ParquetFile(f).metadata.num_rows for f in paths.event_files(root))
    assert said["events"] == stored and said["runs"] == 1
    for f in paths.event_files(root):  # every column of every stored file, the canonical payload text among them
        copy = out / f.relative_to(root)
        assert pq.read_table(copy).equals(pq.read_table(f))
    done = cli("verify", "--root", str(out))
    assert done.returncode == 0, done.stdout
    assert f"{stored} events" in done.stdout and "ok: every hash, chain and typed column checks out" in done.stdout
    row = pq.read_table(exported_steps_file(out)).slice(0, 1).to_pylist()[0]  # an outside checker: the hash from the columns alone
    assert event_hash(row, row["payload"]) == row["hash"]


def test_one_value_edited_in_the_payload_fails_verify(exported):
    _, out, _ = exported
    f = exported_steps_file(out)
    row = pq.read_table(f).to_pylist()[2]
    payload = json.loads(row["payload"])
    payload["loss"] = payload["loss"] - 0.5  # a better loss, written canonically, its typed column to match

    def edit(t: pa.Table) -> pa.Table:
        return set_cell(set_cell(t, "payload", 2, canonical_json(payload)), "loss", 2, payload["loss"])

    rewrite_exported(f, edit)
    done = cli("verify", "--root", str(out))
    assert done.returncode == 1
    assert f"{row['event_id']} (kind=step/run_id={RUN}/{f.name}): hash does not match the stored content" in done.stdout


def test_one_typed_column_edited_fails_verify(exported):
    _, out, _ = exported
    f = exported_steps_file(out)
    eid = pq.read_table(f).column("event_id")[1].as_py()
    rewrite_exported(f, lambda t: set_cell(t, "grad_norm", 1, 0.01))
    done = cli("verify", "--root", str(out))
    assert done.returncode == 1 and f"{eid} (kind=step/run_id={RUN}/{f.name}): column grad_norm = 0.01" in done.stdout


def test_a_chain_cut_short_or_a_file_planted_fails_verify(exported):
    _, out, _ = exported
    f = exported_steps_file(out)
    rewrite_exported(f, lambda t: t.slice(0, t.num_rows - 1))  # the last step of worker-0's second attempt, gone
    planted = f.parent / "part-planted.parquet"
    planted.write_bytes(f.read_bytes())
    done = cli("verify", "--root", str(out))
    assert done.returncode == 1
    assert f"{RUN}:worker-0:1: the chain ends at seq" in done.stdout and "not at the head the export recorded" in done.stdout
    assert f"{planted.relative_to(out)}: in the export, but not in {MANIFEST} (planted?)" in done.stdout


def test_one_run_as_csv_keeps_the_envelope_and_the_payload_text(root, tmp_path):
    build_run(root)
    out = tmp_path / "csv"
    done = cli("export", RUN, "--root", str(root), "--out", str(out), "--format", "csv")
    assert done.returncode == 0, done.stderr
    (f,) = out.glob(f"events/kind=step/run_id={RUN}/*.csv")
    rows = list(csv.DictReader(f.open()))
    assert rows and set(rows[0]) >= {"event_id", "prev_hash", "hash", "payload", "stream_seq", "ingested_at"}
    r = rows[0]
    env = {**r, "attempt": int(r["attempt"]), "seq": int(r["seq"]), "step": int(r["step"]),
           "schema_version": int(r["schema_version"])}
    assert event_hash(env, r["payload"]) == r["hash"]  # recomputed from the CSV alone
    refused = cli("verify", "--root", str(out))
    assert refused.returncode == 2 and "is a csv export: verify checks a Parquet export" in refused.stderr


@pytest.mark.parametrize("args, reason", [
    ([], "name one RUN, or --all"),
    (["nope"], "no events of run 'nope'"),
    (["--all", "--format", "xml"], "invalid choice: 'xml'"),
])
def test_bad_export_input_is_one_line(root, tmp_path, args, reason):
    build_run(root)
    done = cli("export", *args, "--root", str(root), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and reason in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_an_export_never_mixes_with_other_files(root, tmp_path):
    build_run(root)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "mine.txt").write_text("x")
    done = cli("export", "--all", "--root", str(root), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "is not an empty folder" in done.stderr
