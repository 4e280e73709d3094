"""The Hugging Face `Trainer` with `runledger.integrations.hf.RunledgerCallback`: a tiny GPT-2 built from a config
in code (no hub download: HF_HUB_OFFLINE) trains a few steps on the CPU with the real Trainer, then the same
Trainer resumes from its last checkpoint; the ledger holds, read back with SQL, every value of the Trainer's own
log history at its step (train and eval apart, as W&B's callback names them), the totals in the summary, the
config, one checkpoint event per saved folder whose hash is the folder's by `sha256sum`, and one run with two
attempts that `runledger verify` passes.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from runledger.queries import audit
from support.integrations import one_torch_thread  # noqa: F401
from support.integrations import checkpoints_of, sha256sum_manifest, started_configs, values_of
from support.processes import verify
from support.reading import reader

if importlib.util.find_spec("transformers") is None:  # (imported by the test, not at collection: every worker collects)
    pytest.skip("the integrations extra: pip install -e '.[integrations]'", allow_module_level=True)


@pytest.fixture
def offline(monkeypatch):
    for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(var, value)


def tiny_trainer(out_dir, max_steps: int, callback):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                                       eos_token_id=0))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (32, 16), generator=g)
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(output_dir=str(out_dir), max_steps=max_steps, per_device_train_batch_size=4,
                             per_device_eval_batch_size=8, learning_rate=1e-2, logging_steps=1, eval_strategy="steps",
                             eval_steps=2, save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True,
                             dataloader_num_workers=0, seed=0, run_name="tiny-gpt2")
    return Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8], callbacks=[callback])


def expected_values(log_history: list[dict]) -> tuple[dict, dict]:
    """The Trainer's log history as the callback records it: {(step, name): value}, and the summary's totals."""
    from runledger.integrations.hf import SUMMARY_KEYS, rewrite_logs

    values, summary = {}, {}
    for entry in log_history:
        logs = {k: v for k, v in entry.items() if k != "step"}
        summary |= {k: v for k, v in logs.items() if k in SUMMARY_KEYS}
        for name, v in rewrite_logs({k: v for k, v in logs.items() if k not in SUMMARY_KEYS}).items():
            values[entry["step"], name] = float(v)
    return values, summary


def test_a_trainer_and_its_resume_are_one_run_of_two_attempts_exactly_as_its_log_history(local_root, tmp_path, offline, one_torch_thread):
    from runledger.integrations.hf import RunledgerCallback

    out = tmp_path / "out"
    callback = RunledgerCallback(project="hf-tiny", root=str(local_root), system_metrics=False)
    first = tiny_trainer(out, 4, callback)
    first.train()
    run_id = callback.run_id
    assert callback.run.finished and callback.run.attempt == 0

    # the same Trainer, resumed from its last checkpoint for 2 more steps: a new callback finds the run there
    callback = RunledgerCallback(project="hf-tiny", root=str(local_root), system_metrics=False)
    again = tiny_trainer(out, 6, callback)
    again.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert callback.run_id == run_id and callback.run.attempt == 1 and callback.run.finished

    history = again.state.log_history  # steps 1-4 (read from the checkpoint) and 5-6
    values, summary = expected_values(history)
    assert {s for s, _ in values} == set(range(1, 7)) and (2, "eval/loss") in values and (2, "train/loss") in values
    stored = values_of(local_root, run_id)
    assert stored == values
    attempts = reader(local_root).execute("select step, min(attempt), max(attempt) from metrics where run_id = ? "
                                          "group by step order by step", [run_id]).fetchall()
    assert attempts == [(s, 0 if s <= 4 else 1, 0 if s <= 4 else 1) for s in range(1, 7)]
    (final,), = reader(local_root).execute("select summary from runs_finished where run_id = ? and attempt = 1",
                                           [run_id]).fetchall()
    assert summary and {k: json.loads(final)[k] for k in summary} == summary  # the resumed train()'s totals

    # checkpoints 2 and 4 of the first attempt, 6 of the second: each the hash of its folder, by sha256sum
    saved = checkpoints_of(local_root, run_id)
    assert [(a, s, p) for a, s, p, _, _ in saved] == [(0, 2, str(out / "checkpoint-2")), (0, 4, str(out / "checkpoint-4")),
                                                       (1, 6, str(out / "checkpoint-6"))]
    assert all(h == sha256sum_manifest(out / f"checkpoint-{s}") for _, s, _, h, _ in saved)

    # the config: the TrainingArguments and the model's config; each checkpoint carries its attempt's config hash
    configs = started_configs(local_root, run_id)
    assert [a for a, _, _ in configs] == [0, 1]
    for (attempt, config, config_hash), trainer in zip(configs, (first, again)):
        assert config["args"] == json.loads(json.dumps(trainer.args.to_dict(), default=str))
        model = trainer.model.config.to_dict()  # (as at train begin: the save adds architectures and dtype after it)
        assert {k: config["model"][k] for k in model if k not in ("architectures", "dtype")} == \
            {k: v for k, v in json.loads(json.dumps(model)).items() if k not in ("architectures", "dtype")}
        assert config["num_parameters"] == trainer.model.num_parameters()
        assert config["loss_unit"] == "token"  # GPT2LMHeadModel: a causal LM's loss, the mean over its tokens
        assert all(c == config_hash for a, _, _, _, c in saved if a == attempt)
    # the audits: each checkpoint carries its attempt's config hash; the resume names checkpoint-4, as saved
    health = {r["check"]: r for r in audit.run_suite(local_root, "health", run_id).rows()}
    assert health["config_match"]["status"] == "ok", health["config_match"]
    prov = audit.run_suite(local_root, "provenance", run_id)
    lineage = [dict(zip(r.columns, row)) for r in prov.results if r.name.endswith("lineage") for row in r.rows]
    assert [(r["attempt"], r["from_step"], r["lineage"]) for r in lineage] == [
        (0, None, "fresh start"), (1, 4, "matches a saved checkpoint")], lineage
    rc, said = verify(local_root, "--format", "json")
    assert rc == 0 and json.loads(said)["ok"], said


def test_only_the_main_process_records_unless_every_rank_is_asked(local_root, offline):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from runledger.integrations.hf import RunledgerCallback

    args = TrainingArguments(output_dir=str(local_root.parent / "out"), report_to="none", use_cpu=True)
    other_rank = TrainerState(is_world_process_zero=False)
    quiet = RunledgerCallback(root=str(local_root), system_metrics=False)
    quiet.on_train_begin(args, other_rank, TrainerControl())
    quiet.on_log(args, other_rank, TrainerControl(), logs={"loss": 1.0})
    assert quiet.run is None
    every = RunledgerCallback(id="every-rank", root=str(local_root), system_metrics=False, every_rank=True)
    every.on_train_begin(args, other_rank, TrainerControl())
    every.on_log(args, other_rank, TrainerControl(), logs={"loss": 1.0})
    every.on_train_end(args, other_rank, TrainerControl())
    assert every.run.finished and every.run_id == "every-rank"
    rows = reader(local_root).execute("select producer, step, key, value from metrics_all where run_id = 'every-rank'")
    assert rows.fetchall() == [(f"rank-{args.process_index}", 0, "train/loss", 1.0)]
