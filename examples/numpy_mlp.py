"""A plain numpy MLP (no framework) recorded with `runledger.log`: the run the health checks' defaults must
pass without a plan, a schedule or an MoE (issue 43: a numpy MLP at 94% accuracy read `2 fail` before).

    python examples/numpy_mlp.py [--steps 600] [--root DIR]
    runledger audit health RUN
"""

import argparse
import logging
import time

import numpy as np

import runledger

log = logging.getLogger("numpy_mlp")
CONFIG = {"sizes": [10, 32, 3], "examples": 8192, "eval_examples": 1024, "batch_size": 128, "lr": 0.1, "seed": 0}
EVAL_EVERY = 50


def make_data(rng):
    x = rng.normal(size=(CONFIG["examples"], CONFIG["sizes"][0]))
    y = np.argmax(x @ rng.normal(size=(CONFIG["sizes"][0], CONFIG["sizes"][-1])), axis=1)
    n = CONFIG["examples"] - CONFIG["eval_examples"]
    return (x[:n], y[:n]), (x[n:], y[n:])


def forward(params, x):
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    logits = h @ params["w2"] + params["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return h, p / p.sum(axis=1, keepdims=True)


def loss_and_grads(params, x, y):
    """Cross-entropy and its gradients, by hand; with the accuracy."""
    h, p = forward(params, x)
    n = len(y)
    loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
    d = p.copy()
    d[np.arange(n), y] -= 1
    d /= n
    grads = {"w2": h.T @ d, "b2": d.sum(0)}
    dh = (d @ params["w2"].T) * (h > 0)
    grads |= {"w1": x.T @ dh, "b1": dh.sum(0)}
    return loss, grads, (p.argmax(1) == y).mean()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--root")
    ap.add_argument("--name", default="numpy-mlp")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rng = np.random.default_rng(CONFIG["seed"])
    (x, y), (x_eval, y_eval) = make_data(rng)
    a, b, c = CONFIG["sizes"]
    params = {"w1": rng.normal(size=(a, b)) * np.sqrt(2 / a), "b1": np.zeros(b), "w2": np.zeros((b, c)), "b2": np.zeros(c)}
    run = runledger.init(project="numpy-mlp", name=args.name, config={**CONFIG, "steps": args.steps}, root=args.root,
                         loss_unit="sample")  # a classifier: the mean loss over the batch's examples
    for step in range(args.steps):
        start = time.perf_counter()
        idx = rng.integers(0, len(x), CONFIG["batch_size"])
        loss, grads, acc = loss_and_grads(params, x[idx], y[idx])
        for k in params:
            params[k] -= CONFIG["lr"] * grads[k]
        metrics = {"train/loss": float(loss), "train/accuracy": float(acc), "lr": CONFIG["lr"],
                   "train/grad_norm": float(np.sqrt(sum((g ** 2).sum() for g in grads.values()))),
                   "train/param_norm": float(np.sqrt(sum((p ** 2).sum() for p in params.values()))),
                   "train/step_time_s": time.perf_counter() - start}
        if step % EVAL_EVERY == 0 or step == args.steps - 1:
            eval_loss, _, eval_acc = loss_and_grads(params, x_eval, y_eval)
            metrics |= {"eval/loss": float(eval_loss), "eval/accuracy": float(eval_acc)}
            log.info("step %d: loss %.4f, eval accuracy %.3f", step, loss, eval_acc)
        runledger.log(metrics, step=step)
    run.finish()
    log.info("recorded run %s", run.id)


if __name__ == "__main__":
    main()
