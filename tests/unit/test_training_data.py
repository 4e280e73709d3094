"""Training data: batches are a pure function of (seed, step), the mixture is exact per batch, the
held-out split is disjoint from training, and the provenance is a valid `data` payload."""

import numpy as np

from runledger.ledger.contract.validation import check_payload
from runledger.training.config import DataConfig
from runledger.training.data import batch_at, heldout_batches, load_corpus, provenance, rows_per_domain


def test_batches_are_a_pure_function_of_seed_and_step():
    corpus = load_corpus(DataConfig())
    mix = DataConfig().mixture_dict()
    a, b = batch_at(corpus, mix, 7, 12, 8, 32), batch_at(corpus, mix, 7, 12, 8, 32)
    assert np.array_equal(a["inputs"], b["inputs"]) and np.array_equal(a["targets"][:, :-1], a["inputs"][:, 1:])
    assert not np.array_equal(a["inputs"], batch_at(corpus, mix, 7, 13, 8, 32)["inputs"])
    assert not np.array_equal(a["inputs"], batch_at(corpus, mix, 8, 12, 8, 32)["inputs"])


def test_mixture_rows_and_held_out_split():
    # largest remainder: 8 rows are 4 + 2.4 + 1.6, so the one row left goes to math (0.6 > 0.4)
    assert rows_per_domain({"code": 0.5, "prose": 0.3, "math": 0.2}, 8) == {"code": 4, "prose": 2, "math": 2}
    for batch in range(1, 40):  # every batch is filled, each domain within a row of its share
        rows = rows_per_domain({"code": 0.5, "prose": 0.3, "math": 0.2}, batch)
        assert sum(rows.values()) == batch
        assert all(abs(rows[k] - share * batch) < 1 for k, share in {"code": 0.5, "prose": 0.3, "math": 0.2}.items())
    assert rows_per_domain({"code": 0.5, "prose": 0.3, "math": 0.2}, 10) == {"code": 5, "prose": 3, "math": 2}
    corpus = load_corpus(DataConfig())
    assert set(corpus) == {"code", "prose", "math"}
    for dom in corpus.values():
        assert 0 < dom.split < len(dom.tokens)
    held = heldout_batches(corpus, 0, 4, 32, 2)
    assert set(held) == set(corpus) and len(held["code"]) == 2


def test_provenance_is_a_valid_data_payload():
    corpus = load_corpus(DataConfig())
    p = provenance(corpus, DataConfig().mixture_dict(), 0, 10, 64, 100)
    check_payload("data", p)
    assert p["tokens_per_domain"] == {"code": 5 * 64 * 100, "prose": 3 * 64 * 100, "math": 2 * 64 * 100}
    assert {s["domain"] for s in p["sources"]} >= {"code", "prose", "math", "heldout:code"}
    assert all(len(s["sha256"]) == 64 and s["byte_end"] > s["byte_start"] for s in p["sources"])
