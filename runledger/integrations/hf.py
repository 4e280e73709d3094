"""The Hugging Face `Trainer`'s callback: `Trainer(..., callbacks=[RunledgerCallback(project="my-project")])`
records the training run in the ledger through the public logging API (`runledger.init`, `Run.log`,
`run.summary`, `Run.log_checkpoint`, `Run.finish`), as W&B's and Trackio's callbacks record it in theirs, and more.

What each event of the Trainer records (transformers' `TrainerCallback` hooks):
- `on_train_begin`: `runledger.init` with the run's config {"args": `TrainingArguments.to_dict()` (tokens
  redacted by it), "model": the model's config (`model.config.to_dict()`), "num_parameters"}; the run's name is
  `args.run_name` (else this callback's `name`).
- `on_log`: `Run.log` at `state.global_step`, names as W&B's callback writes them (`rewrite_logs`): `eval_*` as
  `eval/*`, `test_*` as `test/*`, the rest as `train/*`; the one-off totals of the end of training
  (`train_runtime`, `train_samples_per_second`, `train_steps_per_second`, `train_loss`, `total_flos`) go to the
  run's summary, as W&B's do.
- `on_save`: `Run.log_checkpoint` of the folder the Trainer just wrote (`{output_dir}/checkpoint-{global_step}`):
  its bytes and content hash (`runledger.content.content_of`), and the seconds since the hook before the save.
- `on_train_end`: `Run.finish()` (a crash before it: the run is finished as failed when the process ends).
- A resumed Trainer (`train(resume_from_checkpoint=...)`) goes on with the same run as its next attempt: the
  run id is kept in the checkpoint's trainer_state.json (this callback is an `ExportableState`), read back on resume;
  its `run_started` names the checkpoint it resumed from with the folder's content hash, hashed again at the start
  (`runledger audit provenance`'s checkpoint lineage matches it to the saved one).
Only the main process records (`state.is_world_process_zero`), unless `every_rank=True`: then each rank is its
own producer (`rank-{process_index}`) of the same run, whose id rank 0 makes and sends to the others.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import runledger
from runledger.content import content_of
from runledger.core import PRODUCER, new_run_id

log = logging.getLogger("runledger.integrations.hf")

# the one-off totals of the Trainer's last log: the run's summary, not a step's values (as W&B's callback)
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")


# what a model's loss is averaged over, told by its head's class name (transformers' naming): a language model's
# or a token classifier's loss is the mean over the labelled tokens, a classifier's of a whole input the mean over
# the batch's examples; any other head declares nothing (docs/health.md, "The loss's unit")
TOKEN_HEADS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration", "ForTokenClassification")
SAMPLE_HEADS = ("ForSequenceClassification", "ForMultipleChoice", "ForImageClassification")


def loss_unit(model) -> str | None:
    """What the loss of `model` is averaged over: "token", "sample" or None (unknown), from its class name."""
    name = type(model).__name__ if model is not None else ""
    return "token" if name.endswith(TOKEN_HEADS) else "sample" if name.endswith(SAMPLE_HEADS) else None


def rewrite_logs(logs: dict) -> dict:
    """The Trainer's log names as W&B's callback writes them: eval_x -> eval/x, test_x -> test/x, x -> train/x."""
    out = {}
    for k, v in logs.items():
        if k.startswith("eval_"):
            out["eval/" + k[5:]] = v
        elif k.startswith("test_"):
            out["test/" + k[5:]] = v
        else:
            out["train/" + k] = v
    return out


class RunledgerCallback(TrainerCallback, ExportableState):
    """Records a `Trainer`'s run in the ledger (see the module docstring for what each hook records).

    project, name, tags, id: as `runledger.init`'s (name: `args.run_name` when set; id: else a new one, or on
    resume the run the checkpoint names). root, nats: where to (`runledger.init`'s). every_rank: every process
    records, each as its own producer; else only the main one. system_metrics, mode: `runledger.init`'s."""

    def __init__(self, project: str | None = "huggingface", name: str | None = None, tags: list[str] | None = None,
                 id: str | None = None, *, root: str | None = None, nats: str | None = None, every_rank: bool = False,
                 system_metrics: bool | float = True, mode: str | None = None) -> None:
        self.project, self.name, self.tags, self.id = project, name, list(tags or []), id
        self.root, self.nats, self.every_rank = None if root is None else str(root), nats, every_rank
        self.system_metrics, self.mode = system_metrics, mode
        self.run: runledger.Run | None = None
        self.run_id: str | None = id  # the run this callback records (kept in the checkpoints' trainer_state.json)
        self._mark = time.perf_counter()  # the end of the last hook: on_save's seconds count from it
        self._after_end = False

    # -- ExportableState: what a checkpoint keeps of this callback (the run's id, for a resumed Trainer)

    def state(self) -> dict:
        return {"args": {"project": self.project, "name": self.name, "tags": self.tags, "id": self.id, "root": self.root,
                         "nats": self.nats, "every_rank": self.every_rank, "system_metrics": self.system_metrics,
                         "mode": self.mode},
                "attributes": {"run_id": self.run_id}}

    # -- the hooks

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not (state.is_world_process_zero or self.every_rank):
            return
        if self.run is not None and not self.run.finished:
            self.run.finish()  # (a hyperparameter search's next trial: a run of its own)
            self.run_id = self.id
        run_id = (self.id or self._saved_run_id(state)) if state.global_step else self.id
        if self.every_rank:
            run_id = _shared_run_id(run_id, args.run_name or self.name, self.project)
        config: dict[str, Any] = {"args": args.to_dict()}
        if model is not None and getattr(model, "config", None) is not None:
            config["model"] = model.config if isinstance(model.config, dict) else model.config.to_dict()
        if model is not None and hasattr(model, "num_parameters"):
            config["num_parameters"] = model.num_parameters()
        self.run = runledger.init(project=self.project, name=args.run_name or self.name, config=config, tags=self.tags,
                                  loss_unit=loss_unit(model),
                                  id=run_id, resume="allow" if run_id else None, root=self.root, nats=self.nats,
                                  producer=f"rank-{args.process_index}" if self.every_rank else PRODUCER,
                                  system_metrics=self.system_metrics, mode=self.mode,
                                  resumed_from=_resumed_from(args, state) if run_id else None)
        self.run_id, self._after_end = self.run.run_id, False
        self._mark = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._mark = time.perf_counter()

    def on_evaluate(self, args, state, control, **kwargs):
        self._mark = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._recording():
            for k in SUMMARY_KEYS:
                if k in logs:
                    self.run.summary[k] = logs[k]
            values = rewrite_logs({k: v for k, v in logs.items() if k not in SUMMARY_KEYS})
            if values:
                self.run.log(values, step=state.global_step)
        self._mark = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        if self._recording():
            seconds = time.perf_counter() - self._mark
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if os.path.isdir(folder):
                self.run.log_checkpoint(folder, step=state.global_step, seconds=seconds)
            else:
                log.warning("run %s: no checkpoint folder %s after the Trainer's save: not recorded", self.run_id, folder)
        self._mark = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is not None and not self.run.finished:
            self.run.finish()
            self._after_end = True

    # -- helpers

    def _recording(self) -> bool:
        if self.run is not None and not self.run.finished:
            return True
        if self._after_end:  # (trainer.evaluate() after train(): the run finished at on_train_end)
            log.warning("run %s finished at the end of training: a later log or save is not recorded", self.run_id)
            self._after_end = False
        return False

    @staticmethod
    def _saved_run_id(state) -> str | None:
        """The run id a resumed Trainer's checkpoint keeps (its trainer_state.json's stateful_callbacks)."""
        saved = (state.stateful_callbacks or {}).get(RunledgerCallback.__name__)
        saved = saved[0] if isinstance(saved, list) and saved else saved
        return (saved or {}).get("attributes", {}).get("run_id") if isinstance(saved, dict) else None


def _resumed_from(args, state) -> dict | None:
    """The checkpoint a resumed Trainer goes on from (`{output_dir}/checkpoint-{global_step}`, hashed again here:
    the audit then shows it is the one saved), or None for a fresh start."""
    folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
    if not state.global_step or not os.path.isdir(folder):
        return None
    return {"path": os.path.abspath(folder), "step": state.global_step, "content_hash": content_of(folder)["sha256"]}


def _shared_run_id(run_id: str | None, name: str | None, project: str | None) -> str:
    """The run id every rank records under: the given (or resumed) one, else one that rank 0 makes and
    sends to the others (torch.distributed, when it is initialized)."""
    import torch.distributed as dist

    if run_id is not None or not (dist.is_available() and dist.is_initialized()):
        return run_id or new_run_id(name, project)
    box = [new_run_id(name, project) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
