"""RFC 9162 hashing and proofs against published answers: the transparency-dev/merkle test vectors
(tests/vectors/merkle, Apache-2.0, its LICENSE beside them) and the 8-leaf tree's known roots."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from runledger.ledger.tlog import merkle

VECTORS = Path(__file__).parent.parent / "vectors" / "merkle" / "testdata"
# transparency-dev/merkle testonly/constants.go: the 8 leaf inputs and the root at each size 0..8
LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                     "606162636465666768696a6b6c6d6e6f")]
ROOTS = ["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
         "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
         "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
         "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
         "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
         "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
         "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
         "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
         "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"]


def _b(s: str) -> bytes:
    return base64.b64decode(s)


def _probes(kind: str) -> list:
    files = sorted((VECTORS / kind).rglob("*.json"))
    assert len(files) > 50, f"the {kind} vectors are missing"
    return [pytest.param(json.loads(f.read_text()), id=str(f.relative_to(VECTORS))) for f in files]


def test_the_known_roots_of_the_8_leaf_tree():
    hashes = [merkle.leaf_hash(x) for x in LEAVES]
    for size, want in enumerate(ROOTS):
        assert merkle.root_of(hashes[:size]).hex() == want
        assert merkle.tree_hash(merkle.full_subtree_hashes(hashes), size).hex() == want


@pytest.mark.parametrize("probe", _probes("inclusion"))
def test_inclusion_vectors(probe):
    def check():
        merkle.verify_inclusion(probe["leafIdx"], probe["treeSize"], _b(probe["leafHash"]),
                                [_b(p) for p in probe["proof"] or []], _b(probe["root"]))
    if probe["wantErr"]:
        with pytest.raises(merkle.ProofError):
            check()
    else:
        check()


@pytest.mark.parametrize("probe", _probes("consistency"))
def test_consistency_vectors(probe):
    def check():
        merkle.verify_consistency(probe["size1"], probe["size2"], _b(probe["root1"]), _b(probe["root2"]),
                                  [_b(p) for p in probe["proof"] or []])
    if probe["wantErr"]:
        with pytest.raises(merkle.ProofError):
            check()
    else:
        check()


def test_made_proofs_verify_at_every_size_and_index():
    hashes = [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(70)]
    node = merkle.full_subtree_hashes(hashes)
    for size in range(1, 71):
        root = merkle.root_of(hashes[:size])
        for i in range(size):
            merkle.verify_inclusion(i, size, hashes[i], merkle.inclusion_proof(node, i, size), root)
        for old in range(1, size + 1):
            proof = merkle.consistency_proof(node, old, size)
            merkle.verify_consistency(old, size, merkle.root_of(hashes[:old]), root, proof)
            if old < size:
                with pytest.raises(merkle.ProofError):  # a proof for another tree does not pass
                    merkle.verify_consistency(old, size, merkle.root_of(hashes[:old]), merkle.leaf_hash(b"x"), proof)


def test_made_proofs_match_the_vectors():
    """Our prover makes the very proofs the vectors hold for the 8-leaf tree."""
    hashes = [merkle.leaf_hash(x) for x in LEAVES]
    node = merkle.full_subtree_hashes(hashes)
    probe = json.loads((VECTORS / "consistency" / "1" / "happy-path.json").read_text())
    assert [base64.b64encode(p).decode() for p in merkle.consistency_proof(node, 1, 8)] == probe["proof"]
    probe = json.loads((VECTORS / "inclusion" / "1" / "happy-path.json").read_text())
    got = merkle.inclusion_proof(node, probe["leafIdx"], probe["treeSize"])
    assert [base64.b64encode(p).decode() for p in got] == probe["proof"]
