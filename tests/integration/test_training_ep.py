"""Expert parallelism: the same run on N CPU devices (shard_map + all_to_all) and on 1 device
(the same per-shard code under vmap) gives the same losses and the same drop counts.

XLA flags must be set before jax is imported, so the N-device run happens in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import dataclasses, json, sys, tempfile
import jax
from runledger.training.config import PRESETS, MoEConfig
from runledger.training.worker import make_mesh, train

assert jax.device_count() == 4, jax.devices()
base = PRESETS["tiny"]
cfg = dataclasses.replace(base, moe=dataclasses.replace(base.moe, shards=4), steps=3, eval_every=100, ckpt_every=100,
                          model=dataclasses.replace(base.model, n_layers=1))  # one layer: half the compile time


out = {}
for name, mesh in (("ep", make_mesh(cfg)), ("one", None)):
    assert (mesh is not None) == (name == "ep")
    with tempfile.TemporaryDirectory() as d:
        res = train(cfg, run_id="ep", ckpt_dir=d, mesh=mesh, peak_flops=1e11)
    out[name] = {"losses": [res.losses[k] for k in sorted(res.losses)],
                 "drops": [[list(l) for l in res.drops[k]] for k in sorted(res.drops)]}
print("RESULT " + json.dumps(out))
"""


def test_expert_parallel_run_matches_the_one_device_run():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    ep, one = out["ep"], out["one"]
    assert len(ep["losses"]) == 3
    assert ep["drops"] == one["drops"]
    assert any(s + r > 0 for step in ep["drops"] for s, r in step)  # the comparison covers real drops
    for a, b in zip(ep["losses"], one["losses"]):
        assert abs(a - b) < 1e-4 * max(1.0, abs(b))
