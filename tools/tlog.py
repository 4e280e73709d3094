"""`runledger tlog keygen|key|checkpoint|prove|consistency|audit`: the transparency log
(runledger.ledger.tlog): make the signing key, print its verifier key, the latest signed checkpoint
(with the witnesses' cosignatures it has), an event's inclusion proof (C2SP tlog-proof), a consistency
proof, and the audit from public files (`--policy`: with a quorum of witness cosignatures; `--tsa-certs`:
checking the checkpoints' RFC 3161 timestamps)."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

from runledger.tools.args import UsageError, add_root, add_signed_args, attestations, producer_keys


def _logs(root: str) -> list[Path]:
    from runledger.ledger.tlog import proofs

    logs = proofs.logs_of(Path(root))
    if not logs:
        raise UsageError(f"{root}: no transparency log (tlog/checkpoint); a ledger writes one as it stores events")
    return logs


def cmd_keygen(args: argparse.Namespace) -> int:
    from runledger.ledger.tlog import log, note

    path = Path(args.out) if args.out else log.key_file()
    if path.exists():
        raise UsageError(f"{path} exists: a log's key is made once (its verifier key: `runledger tlog key`)")
    try:
        signer = log.load_or_make_key(path, args.name)
    except note.NoteError as err:
        raise UsageError(str(err)) from None
    print(signer.verifier.text())
    print(f"signing key: {path} (0600; give it to every ledger host of this log, keep it out of the data root)",
          file=sys.stderr)
    return 0


def cmd_key(args: argparse.Namespace) -> int:
    from runledger.ledger.tlog import log, note

    path = Path(args.key) if args.key else log.key_file()
    try:
        print(note.read_key(path).verifier.text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no key (make one: `runledger tlog keygen`)") from None
    except note.NoteError as err:
        raise UsageError(str(err)) from None
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from runledger.ledger.tlog import tiles

    for d in _logs(args.root):
        sys.stdout.write(tiles.Tiles(d).checkpoint())
    return 0


def prove(root: str, event_id: str) -> str:
    from runledger.ledger.tlog import proofs

    try:
        return proofs.prove(root, event_id)
    except proofs.NotProved as err:
        raise UsageError(str(err)) from None


def cmd_prove(args: argparse.Namespace) -> int:
    text = prove(args.root, args.event_id)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if args.timestamp:
        write_timestamp(args.root, text, Path(args.timestamp))
    return 0


def write_timestamp(root: str, proof: str, out: Path) -> None:
    """Write the RFC 3161 token (DER TimeStampResp) of the checkpoint `proof` is under to `out`, or say
    there is none yet (the authority is asked in the background)."""
    from runledger.ledger.tlog import checkpoint, proofs, tiles, timestamps

    cp = checkpoint.Checkpoint.parse(proofs.text_of(checkpoint.TlogProof.parse(proof).signed_checkpoint))
    for d in _logs(root):
        if checkpoint.Checkpoint.parse(proofs.text_of(tiles.Tiles(d).checkpoint())).origin != cp.origin:
            continue
        token = d / timestamps.path_of(cp.size)
        if token.exists():
            out.write_bytes(token.read_bytes())
            print(f"wrote {out} (the RFC 3161 timestamp of checkpoint size {cp.size})", file=sys.stderr)
            return
    print(f"no timestamp of checkpoint size {cp.size} yet (none configured, or not answered yet)", file=sys.stderr)


def cmd_consistency(args: argparse.Namespace) -> int:
    from runledger.ledger.tlog import checkpoint, merkle, proofs, tiles

    logs = _logs(args.root)
    if len(logs) > 1 and not args.part:
        raise UsageError("a partitioned ledger keeps one log per partition: name one with --part pN")
    d = next((p for p in logs if p.name == args.part), None) if args.part else logs[0]
    if d is None:
        raise UsageError(f"no log {args.part}")
    reader = tiles.Tiles(d)
    cp = checkpoint.Checkpoint.parse(proofs.text_of(reader.checkpoint()))
    if not 0 < args.old <= args.new <= cp.size:
        raise UsageError(f"sizes must be 0 < OLD <= NEW <= {cp.size} (the latest checkpoint's)")
    node = reader.node(cp.size)
    proof = merkle.consistency_proof(node, args.old, args.new) if args.old < args.new else []
    old_root, new_root = merkle.tree_hash(node, args.old), merkle.tree_hash(node, args.new)
    merkle.verify_consistency(args.old, args.new, old_root, new_root, proof)
    print(json.dumps({"origin": cp.origin, "old": args.old, "new": args.new,
                      "old_root": base64.b64encode(old_root).decode(), "new_root": base64.b64encode(new_root).decode(),
                      "proof": [base64.b64encode(p).decode() for p in proof]}, indent=1))
    return 0


def _stamps(args: argparse.Namespace):
    from runledger.ledger.tlog import audit, timestamps

    if args.require_timestamps and not args.tsa_certs:
        raise UsageError("--require-timestamps needs the authority's certificates: --tsa-certs PEM")
    authority = None
    if args.tsa_certs:
        try:
            authority = timestamps.Authority.load(args.tsa_certs)
        except timestamps.TimestampRefused as err:
            raise UsageError(str(err)) from None
    return audit.Stamps(authority, args.require_timestamps)


def cmd_audit(args: argparse.Namespace) -> int:
    from runledger.ledger.check import workers

    workers.start_early(args.events)  # (as `verify`: the row checkers' imports run beside this process's next ones)
    from runledger.ledger.tlog import audit, note, policy

    stamps = _stamps(args)
    pol = None
    if args.policy:
        try:
            pol = policy.load(args.policy)
        except policy.PolicyError as err:
            raise UsageError(str(err)) from None
    if args.vkey:
        vkeys = Path(args.vkey).read_text().split() if Path(args.vkey).is_file() else [args.vkey]
        try:
            verifiers = [note.Verifier.parse(v) for v in vkeys]
        except note.NoteError as err:
            raise UsageError(str(err)) from None
    elif pol is not None and pol.logs:
        verifiers = pol.log_keys()
    else:
        raise UsageError("give the log's verifier key: --vkey, or a --policy with a `log` line")
    if args.log.startswith("s3://"):  # (beside the tables: the bucket as the root names it, else the environment's)
        from runledger.ledger.storage import objects

        if objects.configure(Path(args.events)) is None:
            objects.configure_env()
    try:
        done = audit.audit(args.log, verifiers, args.events, Path(args.state) if args.state else None, pol=pol,
                           stamps=stamps, require_signed=args.require_signed, trusted=producer_keys(args.producer_keys),
                           attestations=attestations(args.attest_key))
    except audit.AuditFailed as err:
        print(f"tlog audit FAILED: {err}")
        return 1
    print(done.text())
    return 0


def register(sub) -> None:
    t = sub.add_parser("tlog", help="the transparency log: key, checkpoint, proofs, and the audit from public files")
    ts = t.add_subparsers(dest="tlog_command", required=True)
    s = ts.add_parser("keygen", help="make the log's signing key (outside the data root, 0600); print its verifier key")
    s.add_argument("--name", default=None, help="the key name, the log's origin (a schema-less URL: example.com/runs)")
    s.add_argument("--out", default=None, help="where (default $RUNLEDGER_TLOG_KEY, else $XDG_CONFIG_HOME/runledger/tlog.key)")
    s.set_defaults(func=cmd_keygen)
    s = ts.add_parser("key", help="the verifier key (signed-note vkey) of the signing key")
    s.add_argument("--key", default=None, help="the key file (default: as keygen)")
    s.set_defaults(func=cmd_key)
    s = ts.add_parser("checkpoint", help="the latest signed checkpoint (each partition's)")
    add_root(s)
    s.set_defaults(func=cmd_checkpoint)
    s = ts.add_parser("prove", help="an event's inclusion proof (C2SP tlog-proof)")
    s.add_argument("event_id")
    s.add_argument("--out", default=None, metavar="F", help="write the proof to F (a .tlog-proof file)")
    s.add_argument("--timestamp", default=None, metavar="F",
                   help="write the RFC 3161 timestamp of the proof's checkpoint to F (DER, a .tsr), if it has one")
    add_root(s)
    s.set_defaults(func=cmd_prove)
    s = ts.add_parser("consistency", help="a consistency proof between two sizes of the log")
    s.add_argument("old", type=int)
    s.add_argument("new", type=int)
    s.add_argument("--part", default=None, help="the partition's log (pN) of a partitioned ledger")
    add_root(s)
    s.set_defaults(func=cmd_consistency)
    s = ts.add_parser("audit", help="check a log and the published tables from public files alone")
    s.add_argument("--log", required=True, metavar="DIR|URL",
                   help="the log's folder ({root}/tlog), URL prefix, or s3://WAREHOUSE/tlog (a warehouse's)")
    s.add_argument("--vkey", default=None, help="the log's verifier key, or a file of them (default: --policy's logs)")
    s.add_argument("--policy", default=None, metavar="F",
                   help="a C2SP tlog-policy file: the checkpoint must carry its quorum of witness cosignatures")
    s.add_argument("--tsa-certs", default=None, metavar="PEM",
                   help="a time-stamping authority's root (and intermediate) certificates: every RFC 3161 timestamp "
                        "of the log must check")
    s.add_argument("--require-timestamps", action="store_true",
                   help="with --tsa-certs: fail unless the audited checkpoint has a valid timestamp")
    s.add_argument("--events", required=True, metavar="DIR", help="the published tables: a root, or an export")
    s.add_argument("--state", default=None, metavar="DIR",
                   help="where the checkpoints audited before are kept (default $XDG_STATE_HOME/runledger/tlog)")
    add_signed_args(s)
    s.set_defaults(func=cmd_audit)
