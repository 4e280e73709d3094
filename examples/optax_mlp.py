"""A first runledger example: a small MLP trained with optax on data made here, logging up to 19 numbers a step.

    python examples/optax_mlp.py          # 1000 steps: about 17 s on 2 CPU cores
    runledger sql "select step, value from metrics where key = 'train/loss'"
    runledger audit health RUN

Two lines record a loop: `runledger.init(...)` before it and `runledger.log({...}, step=k)` inside it.
"""

import argparse
import json
import logging
import time

import jax
import jax.numpy as jnp
import optax

import runledger

log = logging.getLogger("optax_mlp")

# the hyperparameters (recorded in the run's config). The data: 16 features, 4 classes given by a random
# linear teacher, 65536 examples of which the last 4096 are held out for eval (enough that the MLP does not
# overfit in 1000 steps: the eval loss keeps falling, as the health audit asks).
CONFIG = {"sizes": [16, 64, 64, 4], "examples": 65536, "eval_examples": 4096, "batch_size": 512,
          "peak_lr": 1e-3, "warmup_steps": 20, "end_lr_ratio": 0.05, "clip_norm": 1.0, "seed": 0}
EVAL_EVERY = 100  # steps between evals on the held-out examples


def make_data(key):
    kx, kt = jax.random.split(key)
    x = jax.random.normal(kx, (CONFIG["examples"], CONFIG["sizes"][0]))
    y = jnp.argmax(x @ jax.random.normal(kt, (CONFIG["sizes"][0], CONFIG["sizes"][-1])), axis=-1)
    n = CONFIG["examples"] - CONFIG["eval_examples"]
    return (x[:n], y[:n]), (x[n:], y[n:])


def init_params(key):
    """He-initialised layers, the output layer at zero (every class equally likely at first), which keeps
    the first steps' gradient norm under the health audit's 2.0 (Marin's alert threshold)."""
    sizes = CONFIG["sizes"]
    params = [{"w": jax.random.normal(k, (a, b)) * jnp.sqrt(2.0 / a), "b": jnp.zeros(b)}
              for k, a, b in zip(jax.random.split(key, len(sizes) - 1), sizes[:-1], sizes[1:])]
    params[-1]["w"] = jnp.zeros_like(params[-1]["w"])
    return params


def loss_fn(params, x, y):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    logits = x @ params[-1]["w"] + params[-1]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), (logits.argmax(-1) == y).mean()


def make_train_step(optimizer):
    @jax.jit
    def train_step(params, opt_state, x, y):  # pure: (state, batch) -> (state, metrics); logging is outside
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"train/loss": loss, "train/accuracy": acc, "train/grad_norm": optax.global_norm(grads),
                   "train/param_norm": optax.global_norm(params), "optim/update_norm": optax.global_norm(updates)}
        for i, (p, g, u) in enumerate(zip(params, grads, updates)):
            metrics[f"weights/layer_{i}/norm"] = jnp.linalg.norm(p["w"])
            metrics[f"grads/layer_{i}/norm"] = jnp.linalg.norm(g["w"])
            metrics[f"updates/layer_{i}/norm"] = jnp.linalg.norm(u["w"])
        return params, opt_state, metrics
    return train_step


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", help="the ledger root (default: $RUNLEDGER_ROOT, else this user's root)")
    p.add_argument("--steps", type=int, default=1000, help="1000: the audit's loss trend needs 10 blocks of 100 steps")
    p.add_argument("--name", help="the run's name (default: a new one)")
    p.add_argument("--dump-json", help="also write every value logged to this file (for the tests)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    (x, y), (x_eval, y_eval) = make_data(jax.random.PRNGKey(CONFIG["seed"]))
    schedule = optax.warmup_cosine_decay_schedule(0.0, CONFIG["peak_lr"], CONFIG["warmup_steps"], args.steps,
                                                  CONFIG["peak_lr"] * CONFIG["end_lr_ratio"])
    optimizer = optax.chain(optax.clip_by_global_norm(CONFIG["clip_norm"]), optax.adamw(schedule))
    params = init_params(jax.random.PRNGKey(CONFIG["seed"] + 1))
    opt_state, train_step, evaluate = optimizer.init(params), make_train_step(optimizer), jax.jit(loss_fn)
    batches, logged = jax.random.PRNGKey(CONFIG["seed"] + 2), {}

    run = runledger.init(project="optax-mlp", name=args.name, config={**CONFIG, "steps": args.steps}, root=args.root,
                         loss_unit="sample")  # a classifier: the mean loss over the batch's examples
    for step in range(args.steps):
        start = time.perf_counter()
        idx = jax.random.randint(jax.random.fold_in(batches, step), (CONFIG["batch_size"],), 0, len(x))
        params, opt_state, metrics = train_step(params, opt_state, x[idx], y[idx])
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}  # (waits for the step to end)
        metrics["optim/learning_rate"] = float(schedule(step))
        metrics["train/step_time_s"] = time.perf_counter() - start
        metrics["train/examples_per_s"] = CONFIG["batch_size"] / metrics["train/step_time_s"]
        if step % EVAL_EVERY == 0 or step == args.steps - 1:
            eval_loss, eval_acc = evaluate(params, x_eval, y_eval)
            metrics |= {"eval/loss": float(eval_loss), "eval/accuracy": float(eval_acc)}
            log.info("step %d: loss %.4f, eval accuracy %.3f", step, metrics["train/loss"], eval_acc)
        runledger.log(metrics, step=step)
        logged[step] = metrics
    run.summary["eval/best_accuracy"] = max(m.get("eval/accuracy", 0.0) for m in logged.values())
    run.finish()
    if args.dump_json:
        with open(args.dump_json, "w") as f:
            json.dump({"run_id": run.id, "logged": logged}, f)
    log.info("recorded run %s: runledger report %s --root %s --out report.html", run.id, run.id, run.root)


if __name__ == "__main__":
    main()
