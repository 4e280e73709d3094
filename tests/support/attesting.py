"""Helpers of the attestation tests: a small checkpoint-like folder, and attesting it with the test's key."""

from __future__ import annotations

import os
from pathlib import Path

from runledger.ledger import attest

SOURCES = [{"domain": "web", "path": "web/00.txt", "sha256": "ab" * 32, "byte_start": 0, "byte_end": 4096}]
CONFIG = {"model": {"d_model": 32}, "optim": {"peak_lr": 3e-4}, "seed": 0}


def model_folder(where: Path) -> Path:
    """A folder shaped like an orbax checkpoint: state/ with a few files, meta.json beside it."""
    (where / "state" / "d").mkdir(parents=True)
    (where / "state" / "d" / "0.data").write_bytes(os.urandom(4096))
    (where / "state" / "_METADATA").write_text('{"tree": "params"}')
    (where / "meta.json").write_text('{"step": 4}')
    return where


def attest_folder(folder: Path, root: Path | None = None, key: Path | None = None, run_id: str = "r1",
                  config: dict = CONFIG):
    key = key or attest.load_or_make_key()
    return attest.attest(folder, key=key, root=root, config=config, config_hash="c" * 64, data_sources=SOURCES,
                         code_commit="0123456789abcdef0123456789abcdef01234567",
                         run={"run_id": run_id, "producer": "worker-0", "attempt": 0, "step": 4, "tokens_seen": 512},
                         started=1_800_000_000.0, content_hash="f" * 64)


def flip_a_byte(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def read_as_in_toto(st: dict):
    """`st` read by in-toto's reference protos (in-toto-attestation): the statement validated, every resource
    descriptor of its SLSA provenance valid; the provenance proto (ParseError on an unknown field)."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    Statement.copy_from_pb(json_format.ParseDict(st, statement_pb2.Statement())).validate()
    prov = json_format.ParseDict(st["predicate"], provenance_pb2.Provenance())
    for rd in [*prov.build_definition.resolved_dependencies, *prov.run_details.byproducts]:
        ResourceDescriptor.copy_from_pb(rd).validate()
    return prov
