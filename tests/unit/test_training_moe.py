"""The MoE branch: capacity accounting against a plain numpy reference, dispatch against a dense
per-token reference, and drops counted per layer in the model."""


import numpy as np

from runledger.training import moe
from support.moe import ceil_hundredths, random_routing, reference_accounting


def test_capacities_are_integer_exact():
    """ceil(1.1 * 50) is 55; the float product 55.00000000000001 gave 56 (and ~4% of shapes were off by one)."""
    assert moe.capacities(25, 2, 8, 1, 1, 1.10, 1.15)[0] == 55  # pool = ceil(1.1 * 50 / 1)
    off = 0
    for n_local in range(1, 400):
        for S, W, E in ((1, 1, 8), (2, 3, 8), (4, 3, 8), (2, 1, 4), (8, 2, 64)):
            got = moe.capacities(n_local, 2, E, S, W, 1.10, 1.15)
            want = (ceil_hundredths(1.10, 2 * n_local, S * W), ceil_hundredths(1.15, 2 * n_local, (E // S) * W))
            off += got != want
    assert off == 0


def test_some_reference_routings_drop_at_both_stages():
    rng = np.random.default_rng(0)
    top_e = random_routing(rng, 96, 8, 2, 0.3)
    _, s, r = reference_accounting(top_e, 8, 4, 2, 1.0, 1.0)
    assert s > 0 and r > 0
