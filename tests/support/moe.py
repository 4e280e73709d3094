"""moe: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

import numpy as np


def ceil_hundredths(cf: float, a: int, parts: int) -> int:
    """ceil(cf * a / parts) in integers, cf read as a whole number of hundredths (every factor here is)."""
    hundredths = round(cf * 100)
    assert hundredths == cf * 100 or abs(hundredths - cf * 100) < 1e-9
    return -(-hundredths * a // (100 * parts))


def reference_accounting(top_e: np.ndarray, E: int, S: int, W: int, cf_send: float, cf_recv: float,
                         wave_order: str = "in_order"):
    """Pooled-wave accounting written as plain loops over shards, assignments and arrivals.

    Returns (kept [T, k] bool, sender drops, receiver drops)."""
    T, k = top_e.shape
    n, e_local = T // S, E // S
    A = n * k
    pool = ceil_hundredths(cf_send, A, S * W)
    cap = ceil_hundredths(cf_recv, A, e_local * W)
    kept = np.zeros((T, k), bool)
    arrivals = {}  # (receiver expert, wave) -> list of (sender, sender rank, token, slot)
    sender_dropped = 0
    for s in range(S):
        sent_to = [0] * S
        for j in range(k):  # slot-major: every first choice before any second choice
            for t in range(s * n, (s + 1) * n):
                e = int(top_e[t, j])
                r = e // e_local
                rank = sent_to[r]
                sent_to[r] += 1
                if rank >= W * pool:
                    sender_dropped += 1
                    continue
                wave = rank // pool if wave_order == "in_order" else rank % W
                arrivals.setdefault((e, wave), []).append((s, rank, t, j))
    receiver_dropped = 0
    for items in arrivals.values():
        for i, (_, _, t, j) in enumerate(sorted(items)):  # by sender, then sender rank
            if i < cap:
                kept[t, j] = True
            else:
                receiver_dropped += 1
    return kept, sender_dropped, receiver_dropped


def random_routing(rng, T, E, k, skew):
    """Distinct top-k experts per token, drawn with a skewed preference so that drops happen."""
    pref = rng.dirichlet(np.full(E, skew))
    scores = rng.gumbel(size=(T, E)) + np.log(pref)
    return np.argsort(-scores, axis=1)[:, :k].astype(np.int32)
