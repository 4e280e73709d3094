"""Levanter's tracker on runledger (`runledger.levanter`): it is a complete Levanter `Tracker` and
`TrackerConfig` plugin, and a run driven as Levanter's trainer drives its tracker is in the ledger exactly.

Levanter's interface is copied here from its public source (the PyPI `levanter` is from 2023, before
it): marin-community/levanter src/levanter/tracker/tracker.py at commit
9fde0781a1737e088535c392cf239aba5e1143e2 (unchanged through 9263f81e8b453241332c2c0b2d2001bfb2d2241c,
2025-09-26). How the trainer calls it: src/levanter/trainer.py (`train_step` logs the step's metrics,
`training_steps` then its loading time, both at `info.step`), tracker_fns.log_configuration (the
hyperparameters, then config.yaml as an artifact from a temporary directory), main/train_lm.py
(`log_summary({"parameter_count": ...})`, `trainer.tracker.finish()`).
"""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np

from runledger.levanter import HISTOGRAM_STATS, RunledgerConfig
from support.reading import reader


class Histogram:
    """The fields of Levanter's `levanter.tracker.histogram.Histogram` (an equinox Module of JAX scalars)."""

    def __init__(self, values: np.ndarray) -> None:
        self.min, self.max, self.num = values.min(), values.max(), np.float32(values.size)
        self.sum, self.sum_squares = values.sum(), (values ** 2).sum()
        self.bucket_counts, self.bucket_limits = np.histogram(values, bins=4)

    @property
    def mean(self):
        return self.sum / self.num

    @property
    def variance(self):
        return self.sum_squares / self.num - self.mean ** 2


# ---- a run driven as Levanter's trainer drives its tracker ---------------------------------------------


def test_a_run_driven_like_levanters_trainer_is_in_the_ledger_exactly(local_root, tmp_path, caplog):
    import jax.numpy as jnp

    tracker = RunledgerConfig(project="levanter", name="Levanter Run", tags=["levanter"], root=str(local_root),
                              system_metrics=False).init("LevRun.42")  # the trainer's run id, made valid
    assert tracker.run.run_id == "levrun-42" and tracker.run.name == "Levanter Run"

    # tracker_fns.log_configuration: the config as hyperparameters, then as config.yaml from a temp dir
    hparams = {"trainer": {"num_train_steps": 4, "seed": 0, "id": None}, "optimizer": {"learning_rate": 3e-4}}
    tracker.log_hyperparameters(hparams)
    config_yaml = tmp_path / "tmpdir" / "config.yaml"
    config_yaml.parent.mkdir()
    config_yaml.write_text("trainer:\n  num_train_steps: 4\n")
    tracker.log_artifact(str(config_yaml), name="config.yaml", type="config")
    config_bytes, config_sha = len(config_yaml.read_bytes()), hashlib.sha256(config_yaml.read_bytes()).hexdigest()
    config_yaml.unlink()
    tracker.log_summary({"parameter_count": np.int64(123456), "model": {"dtype": "bfloat16"}})

    expected: dict[tuple[int, str], float] = {}
    hists: dict[int, Histogram] = {}
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING, logger="runledger.levanter"):
        for step in range(4):
            # what comes back from the jitted step: numpy/JAX scalars and 0-d arrays, nested dicts, a histogram
            loss, lr = np.float32(2.0 / (step + 1)), jnp.asarray(3e-4 * (step + 1) / 4, dtype=jnp.float32)
            grad_norm, embed_norm = np.float64(rng.uniform(0.1, 1.0)), np.float32(rng.uniform())
            hist = Histogram(rng.normal(size=50))
            metrics = {"train/loss": loss, "optim/learning_rate": lr, "optim/grad_norm": grad_norm, "global_step": step,
                       "grad": {"embed": {"norm": embed_norm}}, "watch/params": hist, "note": "a string"}
            commit = True if step == 3 else None  # the last step committed at once, as a caller may
            tracker.log({**metrics, "throughput/hook_time": 0.25 * step}, step=step, commit=commit)  # train_step
            tracker.log({"throughput/loading_time": np.float64(0.125)}, step=step)  # Trainer.training_steps
            expected |= {(step, "train/loss"): float(loss), (step, "optim/learning_rate"): float(lr),
                         (step, "optim/grad_norm"): float(grad_norm), (step, "global_step"): float(step),
                         (step, "grad/embed/norm"): float(embed_norm), (step, "throughput/hook_time"): 0.25 * step,
                         (step, "throughput/loading_time"): 0.125}
            expected |= {(step, f"watch/params/{stat}"): float(getattr(hist, stat)) for stat in HISTOGRAM_STATS}
            hists[step] = hist
    assert [r.getMessage().count("'note'") for r in caplog.records] == [1]  # left out, said once
    assert tracker.finish() is True

    db = reader(local_root)
    rows = db.execute("select step, key, value, nonfinite from metrics where run_id = 'levrun-42'").fetchall()
    assert {(s, k): v for s, k, v, _ in rows} == expected and len(rows) == len(expected)
    # one metrics event per step, the trainer's calls for it merged (so a step's loss, lr and grad norm
    # sit in one row of `steps`, where the health checks read them); a commit records at once, so the
    # loading time logged after step 3's commit is an event of its own
    events = db.execute("select step, count(*) from metric_events where run_id = 'levrun-42' group by step order by step")
    assert events.fetchall() == [(0, 1), (1, 1), (2, 1), (3, 2)]
    steps = db.execute("select step, loss, lr, grad_norm from steps where run_id = 'levrun-42' order by step").fetchall()
    assert steps == [(s, expected[s, "train/loss"], expected[s, "optim/learning_rate"], expected[s, "optim/grad_norm"])
                     for s in range(4)]

    # each SummaryStats histogram with its buckets as the trainer made them (runledger.values), beside its stats
    stored = db.execute("select step, edges, counts, count, min, max, sum, sum_squares from histograms "
                        "where run_id = 'levrun-42' and key = 'watch/params' order by step").fetchall()
    assert [(s, json.loads(e), json.loads(c), n, lo, hi, total, sq) for s, e, c, n, lo, hi, total, sq in stored] == [
        (s, h.bucket_limits.tolist(), h.bucket_counts.tolist(), float(h.num), float(h.min), float(h.max), float(h.sum),
         float(h.sum_squares)) for s, h in hists.items()]

    updates = db.execute("select config from config_updates where run_id = 'levrun-42' order by seq").fetchall()
    artifact = {"path": str(config_yaml), "type": "config", "bytes": config_bytes, "sha256": config_sha}
    assert [json.loads(c) for (c,) in updates] == [hparams, {"artifacts/config.yaml": artifact}]
    (project, tags), = db.execute("select project, tags from runs where run_id = 'levrun-42'").fetchall()
    assert (project, json.loads(tags)) == ("levanter", ["levanter"])
    (status, final_step, summary), = db.execute(
        "select status, final_step, summary from runs_finished where run_id = 'levrun-42'").fetchall()
    assert (status, final_step) == ("completed", 3)
    summary = json.loads(summary)
    assert summary["parameter_count"] == 123456 and summary["model/dtype"] == "bfloat16"
    assert summary["train/loss"] == expected[3, "train/loss"]  # each metric's last value, by default


def test_a_restarted_trainer_goes_on_with_its_run_as_the_next_attempt(local_root):
    config = RunledgerConfig(root=str(local_root), system_metrics=False)
    first = config.init("resumable")
    first.log({"train/loss": 1.0}, step=0)
    first.log({"train/loss": 0.5}, step=1, commit=True)
    assert first.finish() is True
    again = config.init("resumable")  # resume="allow", as Levanter's W&B config defaults to
    assert again.run.attempt == first.run.attempt + 1 and again.run.step == 2
    again.log({"train/loss": 0.25}, step=2)
    assert again.finish() is True
    stored = reader(local_root).execute("select step, attempt, value from metrics where run_id = 'resumable' order by step")
    assert stored.fetchall() == [(0, 0, 1.0), (1, 0, 0.5), (2, 1, 0.25)]
