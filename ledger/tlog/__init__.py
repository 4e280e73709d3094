"""The transparency log: every stored event a leaf of an RFC 9162 Merkle tree, kept as C2SP
`tlog-tiles` under `{root}/tlog/` (a partition's under `tlog/p{N}/`), with signed C2SP checkpoints,
`tlog-proof` inclusion proofs, C2SP `tlog-witness` cosignatures, RFC 3161 timestamps, and an audit
from public files alone. Its modules:

    merkle.py      RFC 9162 hashing and proofs, pure (no files)
    note.py        C2SP signed notes with Ed25519 keys; keys and verifier keys
    checkpoint.py  C2SP checkpoints and tlog-proof texts
    tiles.py       the tile and entry-bundle paths, and reading a log from files or HTTP
    log.py         the ledger's side: appending leaves after each commit, recovery, signing
    audit.py       the audit from public files: signature, consistency, leaves <-> events, quorum
    cosignature.py C2SP tlog-cosignature v1: witness keys, cosigning, checking cosignatures
    policy.py      C2SP tlog-policy files: logs, witnesses, groups, the quorum
    witness.py     the witness (`runledger witness serve`): add-checkpoint, its state
    witnessing.py  the ledger asking its policy's witnesses to cosign each checkpoint
    timestamps.py  RFC 3161 tokens over checkpoints: asking an authority, checking a token (rfc3161-client)
    timestamping.py the ledger asking its time-stamping authority to stamp each checkpoint
"""
