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

import abc
import dataclasses
import hashlib
import importlib.util
import inspect
import logging
import sys
import types
import typing
from typing import Any, Optional

import numpy as np
import pytest

from runledger import levanter as rl_levanter
from runledger import queries
from runledger.core import PRODUCER, Run
from runledger.ledger.emit.sink import ParquetSink
from runledger.levanter import RunledgerConfig, RunledgerTracker

# ---- Levanter's abstract interface, as src/levanter/tracker/tracker.py defines it (commit above) -------


class Tracker(abc.ABC):
    name: str

    @abc.abstractmethod
    def log_hyperparameters(self, hparams: dict[str, Any]):
        pass

    @abc.abstractmethod
    def log(self, metrics: typing.Mapping[str, typing.Any], *, step: Optional[int], commit: Optional[bool] = None):
        pass

    @abc.abstractmethod
    def log_summary(self, metrics: dict[str, Any]):
        pass

    @abc.abstractmethod
    def log_artifact(self, artifact_path, *, name: Optional[str] = None, type: Optional[str] = None):
        pass

    @abc.abstractmethod
    def finish(self):
        pass


class TrackerConfig(abc.ABC):  # a draccus.PluginRegistry in Levanter: register_subclass(name) as draccus's
    discover_packages_path = "levanter.tracker"
    choices: dict[str, type] = {}

    @classmethod
    def register_subclass(cls, name: str):
        def register(subclass: type) -> type:
            cls.choices[name] = subclass
            return subclass
        return register

    @abc.abstractmethod
    def init(self, run_id: Optional[str]) -> Tracker:
        raise NotImplementedError


def _shape(signature: inspect.Signature) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


# ---- the interface --------------------------------------------------------------------------------------


def test_every_abstract_method_of_levanters_tracker_is_implemented_with_its_signature():
    assert RunledgerTracker.name == "runledger"
    assert Tracker.__abstractmethods__ == {"log_hyperparameters", "log", "log_summary", "log_artifact", "finish"}
    for method in Tracker.__abstractmethods__:
        ours = getattr(RunledgerTracker, method)
        assert not getattr(ours, "__isabstractmethod__", False), method
        assert _shape(inspect.signature(ours)) == _shape(inspect.signature(getattr(Tracker, method))), method
    assert _shape(inspect.signature(RunledgerConfig.init)) == _shape(inspect.signature(TrackerConfig.init))
    assert dataclasses.is_dataclass(RunledgerConfig)
    # Levanter's ABC finds nothing missing in it
    complete = type("Complete", (RunledgerTracker, Tracker), {})
    assert not complete.__abstractmethods__
    complete(run=None)


def test_with_levanter_importable_it_subclasses_tracker_and_registers_as_the_runledger_choice(monkeypatch):
    tracker_module = types.ModuleType("levanter.tracker")
    tracker_module.Tracker, tracker_module.TrackerConfig = Tracker, TrackerConfig
    levanter = types.ModuleType("levanter")
    levanter.tracker = tracker_module
    monkeypatch.setitem(sys.modules, "levanter", levanter)
    monkeypatch.setitem(sys.modules, "levanter.tracker", tracker_module)
    monkeypatch.setattr(TrackerConfig, "choices", {})
    spec = importlib.util.spec_from_file_location("runledger_levanter_under_levanter", rl_levanter.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)

    assert issubclass(module.RunledgerTracker, Tracker) and not module.RunledgerTracker.__abstractmethods__
    assert isinstance(module.RunledgerTracker(run=None), Tracker)
    assert TrackerConfig.choices == {"runledger": module.RunledgerConfig}
    assert issubclass(module.RunledgerConfig, TrackerConfig) and not module.RunledgerConfig.__abstractmethods__
    assert dataclasses.is_dataclass(module.RunledgerConfig)
    assert module.RunledgerConfig(project="p", tags=["a"]).tags == ["a"]


def test_artifacts_are_recorded_by_path_and_content_hash(tmp_path):
    from runledger.levanter import _content_of

    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "a.bin").write_bytes(b"abc")
    (d / "sub" / "b.txt").write_bytes(b"hello\n")
    files = (("a.bin", b"abc"), ("sub/b.txt", b"hello\n"))  # sha256sum's lines, in path order
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in files)
    assert _content_of(str(d)) == {"bytes": 9, "files": 2, "sha256": hashlib.sha256(manifest.encode()).hexdigest()}
    assert _content_of(str(d / "a.bin")) == {"bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}
    assert _content_of("gs://bucket/run/config.yaml") == {"sha256": None}
    assert _content_of(str(tmp_path / "gone")) == {"sha256": None}


@pytest.mark.parametrize("value", [np.zeros(3), [1.0, 2.0], object(), np.array("text")])
def test_a_value_that_is_not_a_number_is_left_out_with_one_warning_not_raised_into_the_trainer(value, tmp_path, caplog):
    run = Run("left-out", project=None, name=None, root=tmp_path, sink=ParquetSink(tmp_path, "left-out", PRODUCER),
              attempt=0, config={}, tags=[], first_step=0, attachment=None)
    tracker = RunledgerTracker(run)
    with caplog.at_level(logging.WARNING, logger="runledger.levanter"):
        tracker.log({"bad": value, "ok": np.float32(0.5)}, step=7)
        tracker.log({"bad": value}, step=8, commit=True)
    assert tracker.finish() is True
    assert queries.connect(tmp_path).execute("select step, key, value from metrics").fetchall() == [(7, "ok", 0.5)]
    assert len(caplog.records) == 1 and "'bad'" in caplog.records[0].getMessage()


def test_a_process_other_than_jax_process_0_records_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(rl_levanter, "_primary", lambda: False)
    tracker = RunledgerConfig(root=str(tmp_path / "root"), system_metrics=False).init("multi-host")
    tracker.log_hyperparameters({"lr": 1e-3})
    tracker.log({"train/loss": 1.0}, step=0)
    tracker.log_summary({"parameter_count": 10})
    assert tracker.finish() is True
    assert not (tmp_path / "root").exists()
