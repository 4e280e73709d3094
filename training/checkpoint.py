"""Checkpoints: the train state saved with orbax, plus a content hash of what was written.

Layout: `{ckpt_dir}/step_{step:08d}/state` (orbax) and `.../meta.json` (step, content_hash,
schedule, config_hash, tokens_seen). The content hash is the sha256 over every array of the state
in tree order (key path, dtype, shape, bytes): it is what a `checkpoint` event records and what a
restore checks, independent of orbax's own file layout and timestamps.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

_CHECKPOINTER: ocp.StandardCheckpointer | None = None


def _checkpointer() -> ocp.StandardCheckpointer:
    global _CHECKPOINTER
    if _CHECKPOINTER is None:
        _CHECKPOINTER = ocp.StandardCheckpointer()
    return _CHECKPOINTER


def content_hash(state) -> str:
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        arr = np.asarray(jax.device_get(leaf))
        h.update(jax.tree_util.keystr(path).encode())
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def step_dir(ckpt_dir: str | Path, step: int) -> Path:
    return Path(ckpt_dir).resolve() / f"step_{step:08d}"


def save(ckpt_dir: str | Path, step: int, state, meta: dict) -> dict:
    """Write the state of `step`; return path, bytes, seconds, content_hash (for the event)."""
    start = time.perf_counter()
    where = step_dir(ckpt_dir, step)
    where.mkdir(parents=True, exist_ok=True)
    ckpt = _checkpointer()
    ckpt.save(where / "state", state, force=True)
    ckpt.wait_until_finished()
    digest = content_hash(state)
    info = {"path": str(where), "step": int(step), "content_hash": digest}
    tmp = where / "meta.json.tmp"
    tmp.write_text(json.dumps({**meta, **info}, sort_keys=True))
    os.replace(tmp, where / "meta.json")
    info["bytes"] = _dir_bytes(where)
    info["seconds"] = time.perf_counter() - start
    return info


def read_meta(path: str | Path) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


def restore(path: str | Path, like, expect_hash: str | None = None):
    """Restore a state shaped like `like`; check its content hash (the meta's, or `expect_hash`)."""
    path = Path(path)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    restored = _checkpointer().restore(path / "state", abstract)
    # plain host-to-device copies, placed like a fresh state: the jitted step is not recompiled
    state = jax.tree.map(lambda a: jax.numpy.asarray(np.asarray(a)), restored)
    want = expect_hash or read_meta(path).get("content_hash")
    got = content_hash(state)
    if want and got != want:
        raise ValueError(f"checkpoint {path} content hash {got[:12]}… does not match the recorded {want[:12]}…")
    return state


def latest(ckpt_dir: str | Path, at_or_before: int | None = None) -> dict | None:
    """The meta of the newest complete checkpoint in `ckpt_dir` (at or before a step), or None."""
    metas = []
    for d in Path(ckpt_dir).glob("step_*"):
        if (d / "meta.json").exists():
            meta = read_meta(d)
            if at_or_before is None or meta["step"] <= at_or_before:
                metas.append(meta)
    return max(metas, key=lambda m: m["step"], default=None)
