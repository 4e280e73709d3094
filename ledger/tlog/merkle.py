"""The Merkle tree of RFC 9162 section 2.1 (as RFC 6962's): leaf and node hashes, tree heads,
inclusion and consistency proofs, made and checked. Pure functions over hashes, no files: a tree is
read through `node(level, index)`, the hash of the full subtree of 2**level leaves starting at leaf
index * 2**level (runledger.ledger.tlog.tiles serves it from tiles). Checked against the
transparency-dev/merkle test vectors (tests/vectors/merkle)."""

from __future__ import annotations

import hashlib
from typing import Callable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()  # MTH({}) (RFC 9162 2.1.1)

Node = Callable[[int, int], bytes]  # (level, index) -> hash of a full subtree


class ProofError(ValueError):
    """A proof that does not verify, or a request no proof answers; one line."""


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_of(leaves: Sequence[bytes]) -> bytes:
    """MTH of the leaf hashes `leaves`."""
    return root_and_levels(leaves)[0]


def root_and_levels(leaves: Sequence[bytes], every: int = 0) -> tuple[bytes, dict[int, list[bytes]]]:
    """MTH of the leaf hashes `leaves`, level by level: each level's nodes paired left to right, an odd
    last one carried up as it is (RFC 9162's tree: the left subtree of n leaves is the largest power of
    two below n, so only the right edge is ever unpaired). With `every`, also the hashes of the full
    subtrees of 2**k leaves for each k a multiple of it ({k: hashes}: tlog-tiles' levels, `every` 8).
    A list comprehension a level (no Python frame a node): an audit hashes a million leaves."""
    size = len(leaves)
    if not size:
        return EMPTY_ROOT, {}
    sha, kept = hashlib.sha256, {}
    level, k = leaves, 0
    while True:
        if every and k % every == 0:
            kept[k] = list(level[:size >> k])
        if len(level) == 1:
            return level[0], kept
        nxt = [sha(b"\x01" + a + b).digest() for a, b in zip(level[0::2], level[1::2])]
        if len(level) & 1:
            nxt.append(level[-1])
        level, k = nxt, k + 1


def full_subtree_hashes(leaves: Sequence[bytes]) -> Node:
    """`node` over an in-memory list of leaf hashes (tests, small trees)."""
    def node(level: int, index: int) -> bytes:
        lo = index << level
        return root_of(leaves[lo:lo + (1 << level)])
    return node


def range_hash(node: Node, lo: int, hi: int) -> bytes:
    """MTH(D[lo:hi]) for a range that is the left-aligned part of a subtree (lo a multiple of the
    largest power of two below hi - lo, as every range RFC 9162's proofs ask for is): the perfect
    subtrees it splits into, left to right, hashed right to left."""
    if hi <= lo:
        return EMPTY_ROOT
    parts: list[bytes] = []
    while lo < hi:
        level = (hi - lo).bit_length() - 1
        while lo & ((1 << level) - 1):  # (an unaligned start: smaller pieces)
            level -= 1
        parts.append(node(level, lo >> level))
        lo += 1 << level
    h = parts.pop()
    while parts:
        h = node_hash(parts.pop(), h)
    return h


def tree_hash(node: Node, size: int) -> bytes:
    return range_hash(node, 0, size)


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1): RFC 9162's k."""
    return 1 << ((n - 1).bit_length() - 1)


def inclusion_proof(node: Node, index: int, size: int) -> list[bytes]:
    """PATH(index, D[0:size]) of RFC 9162 2.1.3.1: sibling hashes from the leaf up."""
    if not 0 <= index < size:
        raise ProofError(f"no inclusion proof for index {index} in a tree of size {size}")
    out: list[bytes] = []

    def path(m: int, lo: int, hi: int) -> None:
        if hi - lo <= 1:
            return
        k = _split(hi - lo)
        if m < k:
            path(m, lo, lo + k)
            out.append(range_hash(node, lo + k, hi))
        else:
            path(m - k, lo + k, hi)
            out.append(range_hash(node, lo, lo + k))
    path(index, 0, size)
    return out


def consistency_proof(node: Node, old: int, new: int) -> list[bytes]:
    """PROOF(old, D[0:new]) of RFC 9162 2.1.4.1."""
    if not 0 < old <= new:
        raise ProofError(f"no consistency proof from size {old} to size {new}")
    out: list[bytes] = []

    def subproof(m: int, lo: int, hi: int, whole: bool) -> None:
        n = hi - lo
        if m == n:
            if not whole:
                out.append(range_hash(node, lo, hi))
            return
        k = _split(n)
        if m <= k:
            subproof(m, lo, lo + k, whole)
            out.append(range_hash(node, lo + k, hi))
        else:
            subproof(m - k, lo + k, hi, False)
            out.append(range_hash(node, lo, lo + k))
    subproof(old, 0, new, True)
    return out


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """RFC 9162 2.1.3.2: the root that `proof` leads `leaf` at `index` to, or ProofError."""
    if not 0 <= index < size:
        raise ProofError(f"index {index} is beyond the tree's size {size}")
    if len(leaf) != HASH_SIZE or any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("a hash of the wrong length")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the proof is shorter than the tree is deep")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise ProofError(f"the inclusion proof of leaf {index} does not lead to the root of size {size}")


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """RFC 9162 2.1.4.2; raises ProofError. A proof from size 0 is refused (meaningless), and equal
    sizes need an empty proof and equal roots (as transparency-dev/merkle's verifier)."""
    if old > new:
        raise ProofError(f"the old size {old} is larger than the new size {new}")
    if old == 0:
        raise ProofError("a consistency proof from the empty tree proves nothing")
    if old == new:
        if proof:
            raise ProofError("equal sizes, but the proof is not empty")
        if old_root != new_root:
            raise ProofError(f"two different roots for size {old}")
        return
    if any(len(p) != HASH_SIZE for p in proof) or len(old_root) != HASH_SIZE:
        raise ProofError("a hash of the wrong length")
    if not proof:
        raise ProofError("an empty consistency proof")
    path = list(proof)
    if old & (old - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError(f"the consistency proof does not lead to the old root (size {old})")
    if sr != new_root:
        raise ProofError(f"the consistency proof does not lead to the new root (size {new})")
