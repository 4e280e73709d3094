"""Keras 3 on the JAX backend with `runledger.integrations.keras.RunledgerCallback`: a small model fits two epochs of
4 batches with validation, once logging per epoch and once per batch, in a process of its own (KERAS_BACKEND must
be set before Keras is first imported, and this test's process is shared with others); the ledger holds, read back
with SQL, every value of Keras' `History` at its epoch's step, and per batch every batch's logs as Keras gave them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from support.integrations import started_configs, values_of
from support.processes import verify

if importlib.util.find_spec("keras") is None:  # (not imported here: its backend is the child's to choose)
    pytest.skip("the integrations extra: pip install -e '.[integrations]'", allow_module_level=True)

FIT = textwrap.dedent("""
    import json, sys

    import keras
    import numpy as np

    from runledger.integrations.keras import RunledgerCallback

    class Batches(keras.callbacks.Callback):  # what Keras hands every callback after each batch
        def __init__(self):
            super().__init__()
            self.logs = []

        def on_train_batch_end(self, batch, logs=None):
            self.logs.append(dict(logs))

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    out = {}
    for freq in ("epoch", "batch"):
        ours, batches = RunledgerCallback(project="keras-tiny", log_freq=freq, system_metrics=False), Batches()
        history = model.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:8], y[:8]), verbose=0,
                            callbacks=[ours, batches])
        out[freq] = {"run_id": ours.run.run_id, "finished": ours.run.finished, "history": history.history,
                     "batches": batches.logs}
    json.dump(out, open(sys.argv[1], "w"), default=float)
""")


def test_a_keras_fit_is_in_the_ledger_per_epoch_and_per_batch_as_its_history(local_root, tmp_path):
    out = tmp_path / "fit.json"
    env = {**os.environ, "KERAS_BACKEND": "jax", "RUNLEDGER_SILENT": "1"}
    done = subprocess.run([sys.executable, "-c", FIT, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fits = json.loads(out.read_text())

    per_epoch = fits["epoch"]
    assert per_epoch["finished"] and set(per_epoch["history"]) == {"loss", "mae", "val_loss", "val_mae"}
    expected = {(epoch, f"epoch/{k}"): v for k, values in per_epoch["history"].items() for epoch, v in enumerate(values)}
    assert values_of(local_root, per_epoch["run_id"]) == expected

    per_batch = fits["batch"]
    steps_per_epoch = len(per_batch["batches"]) // 2
    assert steps_per_epoch == 4
    expected = {(b, f"batch/{k}"): v for b, logs in enumerate(per_batch["batches"]) for k, v in logs.items()}
    expected |= {(steps_per_epoch * (epoch + 1) - 1, f"epoch/{k}"): v for k, values in per_batch["history"].items()
                 for epoch, v in enumerate(values)}
    assert values_of(local_root, per_batch["run_id"]) == expected

    (_, config, _), = started_configs(local_root, per_batch["run_id"])
    assert config["keras"]["backend"] == "jax" and config["fit"]["epochs"] == 2 and config["num_parameters"] == 49
    rc, said = verify(local_root, "--format", "json")
    assert rc == 0 and json.loads(said)["ok"], said
