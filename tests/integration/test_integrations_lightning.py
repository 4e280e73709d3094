"""Lightning's `Trainer` with `runledger.integrations.lightning.RunledgerLogger` beside Lightning's own CSVLogger: a
tiny LightningModule trains two epochs of 4 steps on the CPU, validating each epoch, with a ModelCheckpoint saving
every epoch; the ledger holds, read back with SQL, every value of every row of the CSVLogger's metrics.csv at its
step, the hyperparameters, one checkpoint event per saved file with its SHA-256, the run id as the logger's
version, and the run finished as completed; `runledger verify` passes.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json

import pytest

from support.integrations import one_torch_thread  # noqa: F401
from support.integrations import checkpoints_of, values_of
from support.processes import verify
from support.reading import reader

if importlib.util.find_spec("lightning") is None:  # (imported by the test, not at collection: every worker collects)
    pytest.skip("the integrations extra: pip install -e '.[integrations]'", allow_module_level=True)


def tiny_module(lr: float):
    import lightning.pytorch as pl
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self, lr: float, hidden: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Tiny(lr)


def test_a_lightning_run_holds_what_its_csv_logger_wrote_and_its_checkpoints(local_root, tmp_path, one_torch_thread):
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from runledger.integrations.lightning import RunledgerLogger

    torch.manual_seed(0)
    x = torch.randn(32, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    ours = RunledgerLogger(project="lightning-tiny", name="tiny", root=str(local_root), system_metrics=False)
    theirs = CSVLogger(str(tmp_path / "csv"), name="tiny")
    saves = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1, every_n_epochs=1)
    trainer = pl.Trainer(max_epochs=2, logger=[ours, theirs], callbacks=[saves], log_every_n_steps=1, accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(tiny_module(lr=0.05), loader, loader)
    run_id = ours.version  # (after the fit: its run, finished, and no new attempt)

    with open(theirs.log_dir + "/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    expected = {(int(r["step"]), k): float(v) for r in rows for k, v in r.items() if k != "step" and v != ""}
    assert {k for _, k in expected} == {"train_loss", "val_loss", "epoch"} and len(rows) >= 8
    assert values_of(local_root, run_id) == expected

    hparams, = reader(local_root).execute("select config from config_updates where run_id = ?", [run_id]).fetchall()
    assert json.loads(hparams[0]) == {"lr": 0.05, "hidden": 8}
    saved = checkpoints_of(local_root, run_id)
    files = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    assert len(files) == 2 and sorted(p for _, _, p, _, _ in saved) == [str(f) for f in files]
    assert {p: h for _, _, p, h, _ in saved} == {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    # each at the last step logged before its save (Lightning's log axis: epoch 0's val_loss is at step 3)
    assert [s for _, s, _, _, _ in saved] == [max(s for s, _ in expected if s < 4), max(s for s, _ in expected)] == [3, 7]
    (status,), = reader(local_root).execute("select status from runs_finished where run_id = ?", [run_id]).fetchall()
    assert status == "completed"
    attempts = reader(local_root).execute("select distinct attempt from events where run_id = ?", [run_id]).fetchall()
    assert attempts == [(0,)]
    rc, said = verify(local_root, "--format", "json")
    assert rc == 0 and json.loads(said)["ok"], said
