"""Byte-level training data: three domains from files on every machine, a declared mixture,
a held-out split, batches that are a pure function of (seed, step), and their provenance.

Domains:
- `code`: Python's stdlib sources (top-level `*.py` in sorted order, up to `code_bytes`);
- `prose`: the text of `pydoc_data.topics` (the help topics, values in key order);
- `math`: generated arithmetic lines (`37*4=148`), from a fixed generator seed.
Each domain's bytes are split: the last `heldout_fraction` is held out for evaluation.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass

import numpy as np

from runledger.training.config import DataConfig

MATH_SEED = 12345  # the arithmetic domain is the same on every machine
MATH_LINES = 40_000


@dataclass(frozen=True)
class Source:
    domain: str
    path: str
    sha256: str
    byte_start: int
    byte_end: int


@dataclass(frozen=True)
class Domain:
    name: str
    tokens: np.ndarray  # uint8 bytes
    split: int  # tokens[:split] train, tokens[split:] held out
    sources: tuple[Source, ...]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _code(limit: int) -> tuple[bytes, list[Source]]:
    root = sysconfig.get_paths()["stdlib"]
    parts, sources, total = [], [], 0
    for name in sorted(f for f in os.listdir(root) if f.endswith(".py")):
        path = os.path.join(root, name)
        with open(path, "rb") as fh:
            raw = fh.read()
        take = raw[: limit - total]
        parts.append(take)
        sources.append(Source("code", path, _sha256(raw), 0, len(take)))
        total += len(take)
        if total >= limit:
            break
    return b"".join(parts), sources


def _prose() -> tuple[bytes, list[Source]]:
    import pydoc_data.topics as topics

    with open(topics.__file__, "rb") as fh:
        raw = fh.read()
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics)).encode()
    return text, [Source("prose", topics.__file__, _sha256(raw), 0, len(raw))]


def _math() -> tuple[bytes, list[Source]]:
    rng = np.random.default_rng(MATH_SEED)
    a = rng.integers(0, 1000, MATH_LINES)
    b = rng.integers(0, 100, MATH_LINES)
    op = rng.integers(0, 3, MATH_LINES)
    lines = []
    for x, y, o in zip(a.tolist(), b.tolist(), op.tolist()):
        sym, val = (("+", x + y), ("-", x - y), ("*", x * y))[o]
        lines.append(f"{x}{sym}{y}={val}\n")
    text = "".join(lines).encode()
    return text, [Source("math", f"generated:arithmetic?seed={MATH_SEED}&lines={MATH_LINES}", _sha256(text), 0, len(text))]


@functools.lru_cache(maxsize=4)
def load_corpus(cfg: DataConfig) -> dict[str, Domain]:
    """Every domain of the mixture, loaded once per process."""
    builders = {"code": lambda: _code(cfg.code_bytes), "prose": _prose, "math": _math}
    out = {}
    for name, _ in cfg.mixture:
        data, sources = builders[name]()
        tokens = np.frombuffer(data, np.uint8)
        out[name] = Domain(name, tokens, int(len(tokens) * (1 - cfg.heldout_fraction)), tuple(sources))
    return out


def rows_per_domain(mixture: dict[str, float], batch_size: int) -> dict[str, int]:
    """The declared mixture as whole rows per batch (largest remainder), so counts are exact."""
    total = sum(mixture.values())
    want = {k: v / total * batch_size for k, v in mixture.items()}
    rows = {k: int(v) for k, v in want.items()}
    for k in sorted(want, key=lambda k: rows[k] - want[k])[: batch_size - sum(rows.values())]:
        rows[k] += 1
    return rows


def batch_at(corpus: dict[str, Domain], mixture: dict[str, float], seed: int, step: int,
             batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    """The training batch of `step`: a pure function of (seed, step) and the shapes."""
    rng = np.random.default_rng([seed, step])
    rows = []
    for name, n in rows_per_domain(mixture, batch_size).items():
        dom = corpus[name]
        starts = rng.integers(0, dom.split - seq_len - 1, n)
        rows += [dom.tokens[s: s + seq_len + 1] for s in starts]
    order = rng.permutation(batch_size)
    seqs = np.stack(rows)[order].astype(np.int32)
    return {"inputs": seqs[:, :-1], "targets": seqs[:, 1:]}


def heldout_batches(corpus: dict[str, Domain], seed: int, batch_size: int, seq_len: int,
                    n_batches: int) -> dict[str, list[dict[str, np.ndarray]]]:
    """Fixed held-out batches per domain (the same at every eval of the run)."""
    out = {}
    for i, (name, dom) in enumerate(sorted(corpus.items())):
        rng = np.random.default_rng([seed, 1_000_003, i])
        batches = []
        for _ in range(n_batches):
            starts = rng.integers(dom.split, len(dom.tokens) - seq_len - 1, batch_size)
            seqs = np.stack([dom.tokens[s: s + seq_len + 1] for s in starts]).astype(np.int32)
            batches.append({"inputs": seqs[:, :-1], "targets": seqs[:, 1:]})
        out[name] = batches
    return out


def provenance(corpus: dict[str, Domain], mixture: dict[str, float], seed: int, batch_size: int,
               seq_len: int, steps: int) -> dict:
    """The `data` event payload: sources with sha256 and byte ranges (train split, then held out
    as domain `heldout:<name>`, path `domain:<name>`, offsets into the domain's concatenated bytes),
    and the planned tokens per domain."""
    sources = []
    for dom in corpus.values():
        sources += [vars(s) for s in dom.sources]
        sources.append({"domain": f"heldout:{dom.name}", "path": f"domain:{dom.name}",
                        "sha256": _sha256(dom.tokens[dom.split:].tobytes()),
                        "byte_start": dom.split, "byte_end": len(dom.tokens)})
    rows = rows_per_domain(mixture, batch_size)
    return {
        "sources": sources,
        "tokens_per_domain": {k: int(n * seq_len * steps) for k, n in rows.items()},
        "mixture": {k: float(v) for k, v in mixture.items()},
        "seed": int(seed),
    }
