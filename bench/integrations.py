"""What the Hugging Face Trainer's callback costs a training loop: runledger's `RunledgerCallback` against Trackio's
`TrackioCallback` and W&B's `WandbCallback` (offline), each in the same tiny `Trainer`, as ratios.

    pip install -e '.[integrations,peers]'
    python -m bench.integrations [--steps N] [--only runledger,trackio,wandb]

Each callback drives the same Trainer (a GPT-2 of 2 layers, hidden 16, vocabulary 64, built from its config, on
the CPU; batch 4 of 16 tokens) for N steps, logging every step (`logging_steps=1`) and evaluating never, in a
fresh process of its own, torch on one thread (its idle threads spin, taking the CPU from the callback's
threads on a machine of few cores). The callback is wrapped in one that times every hook it gets (`Timed`), so what is
measured is the time the Trainer spent inside that callback, not the training around it:
  per log   the time in every hook but on_train_begin and on_train_end at one step (on_log, and on_step_begin,
            on_step_end, ... of that step): its median over the steps (mean: their sum over the logs, with the
            first call's one-off costs): what the callback adds to each step
  begin     on_train_begin: runledger starts the root's embedded server and ledger and records run_started;
            Trackio opens its SQLite store; W&B starts its wandb-core service, offline
  end       on_train_end: runledger waits until the ledger stored every event (`Run.finish` returns True);
            Trackio drains its queue into SQLite; W&B finishes its offline run file
Ratios are runledger/peer from the same command (below 1: runledger costs less); the machine's other load
moves the absolute numbers more than the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PEERS = ("runledger", "trackio", "wandb")


def timed(inner):
    """`inner` wrapped: every hook of the Trainer's goes to it, and the time spent in it is added up per hook."""
    from transformers import TrainerCallback

    class Timed(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: dict[str, float] = {}
            self.calls: dict[str, int] = {}
            self.per_step: dict[int, float] = {}  # global step -> seconds in the steady hooks (not begin, end)

    def hook(name):
        def call(self, args, state, control, **kwargs):
            start = time.perf_counter()
            result = getattr(inner, name)(args, state, control, **kwargs)
            took = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + took
            self.calls[name] = self.calls.get(name, 0) + 1
            if name not in ("on_train_begin", "on_train_end", "on_init_end"):
                self.per_step[state.global_step] = self.per_step.get(state.global_step, 0.0) + took
            return result
        return call

    for name in dir(TrainerCallback):
        if name.startswith("on_"):
            setattr(Timed, name, hook(name))
    return Timed()


def run_one(peer: str, steps: int, work: str) -> dict:
    """Train the tiny model for `steps` steps with `peer`'s callback; the seconds spent in it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    if peer == "runledger":
        from runledger.integrations.hf import RunledgerCallback

        inner = RunledgerCallback(project="bench-integrations", root=os.path.join(work, "root"), system_metrics=False)
    elif peer == "trackio":
        from transformers.integrations import TrackioCallback

        inner = TrackioCallback()
    else:
        from transformers.integrations import WandbCallback

        inner = WandbCallback()
    torch.set_num_threads(1)  # (torch's other threads spin between ops: on a small machine they take the callback's CPU)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    tokens = torch.randint(0, 64, (4 * steps, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    args = TrainingArguments(output_dir=os.path.join(work, "out"), max_steps=steps, per_device_train_batch_size=4,
                             logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                             dataloader_num_workers=0, seed=0, run_name="bench-integrations",
                             project="bench-integrations")
    callback = timed(inner)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.remove_callback(PrinterCallback)  # (it prints each log: not a tracker's cost)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    logs = callback.calls.get("on_log", 0)
    steady = sorted(callback.per_step.values())
    return {"peer": peer, "steps": steps, "logs": logs, "per_log_ms": 1e3 * statistics.median(steady),
            "mean_ms": 1e3 * sum(steady) / max(logs, 1), "p90_ms": 1e3 * steady[int(0.9 * (len(steady) - 1))],
            "max_ms": 1e3 * steady[-1], "first_ms": 1e3 * callback.per_step.get(1, 0.0),
            "begin_s": callback.seconds.get("on_train_begin", 0.0), "end_s": callback.seconds.get("on_train_end", 0.0),
            "train_s": total}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--only", default=",".join(PEERS))
    p.add_argument("--one", help=argparse.SUPPRESS)  # (in the fresh process of one peer)
    a = p.parse_args(argv)
    if a.one:
        with tempfile.TemporaryDirectory() as work:
            os.environ.update(HF_HUB_OFFLINE="1", WANDB_SILENT="true", WANDB_DIR=work, TRACKIO_DIR=os.path.join(work, "trackio"),
                              RUNLEDGER_SILENT="1", TOKENIZERS_PARALLELISM="false")
            if a.one == "wandb":  # (only W&B's process: runledger reads $WANDB_MODE too, as W&B scripts set it)
                os.environ["WANDB_MODE"] = "offline"
            try:
                print(json.dumps(run_one(a.one, a.steps, work)))
            finally:
                if a.one == "runledger":
                    from runledger.ledger import local

                    local.down(os.path.join(work, "root"))
        return
    results = {}
    for peer in a.only.split(","):
        done = subprocess.run([sys.executable, "-m", "bench.integrations", "--one", peer, "--steps", str(a.steps)],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            print(f"{peer}: failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        results[peer] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'callback':<10} {'steps':>5} {'logs':>5} {'per log ms':>11} {'mean ms':>8} {'p90 ms':>7} {'max ms':>7}"
          f" {'1st ms':>7} {'begin s':>8} {'end s':>7} {'train s':>8} {'runledger/peer: per log':>24} {'mean':>5}")
    ours = results.get("runledger")
    for peer, r in results.items():
        ratios = (f"{ours['per_log_ms'] / r['per_log_ms']:.2f}", f"{ours['mean_ms'] / r['mean_ms']:.2f}") \
            if ours and peer != "runledger" else ("", "")
        print(f"{peer:<10} {r['steps']:>5} {r['logs']:>5} {r['per_log_ms']:>11.3f} {r['mean_ms']:>8.3f} {r['p90_ms']:>7.3f}"
              f" {r['max_ms']:>7.1f} {r['first_ms']:>7.1f} {r['begin_s']:>8.2f}"
              f" {r['end_s']:>7.2f} {r['train_s']:>8.1f} {ratios[0]:>24} {ratios[1]:>5}")


if __name__ == "__main__":
    main()
