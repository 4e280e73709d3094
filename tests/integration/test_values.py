"""A W&B script that logs histograms, tables, images and files and prints, run with only `import runledger as wandb`, on
the embedded local server and ledger: every value read back exactly with SQL (bucket counts and edges equal, table
rows equal, each blob's bytes the image's or file's, by SHA-256, each printed line), `verify` passes; then a blob edited and a blob
deleted are each named by `runledger verify` (exit 1), and a blob replaced by a link is refused too.
`import runledger` and naming the values loads no numpy; logging a value does the work."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np

import runledger
from runledger.ledger.check.verify import verify
from runledger.ledger.storage.media import blob_path
from support import REPO
from support.reading import reader


def test_a_wandb_script_logs_every_kind_and_reads_it_back_exactly(local_root, tmp_path):
    import jax.numpy as jnp
    from PIL import Image as PIL

    wandb = runledger  # as a W&B script has it: `import runledger as wandb`
    rng = np.random.default_rng(7)
    photo = tmp_path / "photo.png"
    PIL.fromarray(rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)).save(photo)
    notes = tmp_path / "notes.txt"
    notes.write_text("generation settings\n")
    run = wandb.init(project="rich", name="rich-1", system_metrics=False)
    sent = {}
    for step in range(3):
        grads = rng.normal(size=500)
        pixels = rng.integers(0, 256, size=(4, 6), dtype=np.uint8)
        rows = [[f"prompt {step}-{i}", f"answer {i} of step {step}", float(i) / 3, i % 2 == 0] for i in range(4)]
        wandb.log({"loss": 1.0 / (step + 1), "grads": wandb.Histogram(grads, num_bins=50), "bare": list(range(step + 2)),
                   "gens": wandb.Table(columns=["prompt", "output", "score", "ok"], data=rows),
                   "sample": wandb.Image(pixels, caption=f"step {step}"), "photo": wandb.Image(str(photo)),
                   "notes": wandb.File(notes), "on_device": jnp.asarray(grads[:100])})  # a JAX array: a Histogram
        sent[step] = (grads, pixels, rows)
        print(f"step {step}: loss {1.0 / (step + 1):.3f}")  # the console, as a W&B script prints it
    print("done", file=sys.stderr)
    assert run.finish() is True

    db = reader(local_root)
    where = f"where run_id = '{run.run_id}'"
    for step, (grads, pixels, rows) in sent.items():
        counts, edges = np.histogram(grads, bins=50)
        got = db.execute(f"select bucket, lo, hi, count from histogram_buckets {where} and key = 'grads' and step = {step} "
                         "order by bucket").fetchall()
        assert got == [(i, edges[i], edges[i + 1], counts[i]) for i in range(50)]
        (n, lo, hi, total, squares), = db.execute(f"select count, min, max, sum, sum_squares from histograms {where} "
                                                   f"and key = 'grads' and step = {step}").fetchall()
        assert (n, lo, hi, total, squares) == (500, grads.min(), grads.max(), grads.sum(), np.square(grads).sum())
        bare = db.execute(f"select count from histograms {where} and key = 'bare' and step = {step}").fetchall()
        assert bare == [(step + 2,)]
        (counts,), = db.execute(f"select counts from histograms {where} and key = 'on_device' and step = {step}").fetchall()
        assert json.loads(counts) == np.histogram(np.asarray(jnp.asarray(grads[:100])), bins=64)[0].tolist()
        got = db.execute(f"select cells from table_rows {where} and key = 'gens' and step = {step} order by row_index")
        assert [json.loads(c) for (c,) in got.fetchall()] == rows
        (digest, size, kind, caption, width, height), = db.execute(
            f"select sha256, bytes, type, caption, width, height from media {where} and key = 'sample' and step = {step}").fetchall()
        png = blob_path(local_root, digest).read_bytes()
        assert hashlib.sha256(png).hexdigest() == digest and len(png) == size and (kind, caption) == ("image/png", f"step {step}")
        assert (width, height) == (6, 4) and np.array_equal(np.asarray(PIL.open(io.BytesIO(png))), pixels)
    hits = db.execute(f"select step, row_index from table_rows {where} and text ilike '%answer 2 of step 1%'").fetchall()
    assert hits == [(1, 2)]
    photos = db.execute(f"select distinct sha256, name, type from media {where} and key = 'photo'").fetchall()
    assert photos == [(hashlib.sha256(photo.read_bytes()).hexdigest(), "photo.png", "image/png")]  # one blob, 3 events
    (notes_digest,), = db.execute(f"select distinct sha256 from media {where} and key = 'notes'").fetchall()
    assert notes_digest == hashlib.sha256(notes.read_bytes()).hexdigest()
    assert db.execute(f"select step, key, value from metrics {where} order by step").fetchall() == [
        (0, "loss", 1.0), (1, "loss", 0.5), (2, "loss", 1 / 3)]  # the numbers beside them, as ever
    printed = db.execute(f"select stream, line_no, text from console_lines {where} order by stream desc, line_no").fetchall()
    assert printed == [("stdout", i, f"step {i}: loss {1.0 / (i + 1):.3f}") for i in range(3)] + [("stderr", 0, "done")]
    assert verify(local_root).ok

    # an edited blob and a deleted one are each named; a blob swapped for a link to a file outside the root too
    sample = blob_path(local_root, db.execute(f"select sha256 from media {where} and key = 'sample' and step = 0").fetchone()[0])
    sample.write_bytes(sample.read_bytes()[:-1] + b"\x00")
    blob_path(local_root, notes_digest).unlink()
    cli = [sys.executable, "-m", "runledger.tools.cli", "verify", "--root", str(local_root)]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{sample}: the blob" in out.stdout and "has changed" in out.stdout
    assert f"{blob_path(local_root, notes_digest)}: the blob" in out.stdout and "is missing" in out.stdout
    photo_blob = blob_path(local_root, photos[0][0])
    photo_blob.unlink()
    os.symlink(photo, photo_blob)  # the same bytes, but outside the root: not the ledger's to vouch for
    assert any(str(photo_blob) in p and "not a plain file" in p for p in verify(local_root).problems)


def test_naming_the_values_loads_no_numpy_until_one_is_logged():
    code = ("import sys, runledger\n"
            "h, t, i = runledger.Histogram([1, 2]), runledger.Table(columns=['a']), runledger.Image([[0]])\n"
            "assert not {'numpy', 'pydantic', 'pyarrow'} & set(sys.modules), sorted(sys.modules)\n"
            "h.payload()\n"
            "assert 'numpy' in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr

